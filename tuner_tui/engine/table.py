"""The table that `bench` and `tune` print, and the one-line summary of a trial."""

from __future__ import annotations

from tuner_tui import format as fmt
from tuner_tui.engine import protocol
from tuner_tui.engine.profile import describe


def summary(r: protocol.TrialResult) -> str:
    if r.status == "ok" and r.tokens_per_s:
        return f"{fmt.si(r.tokens_per_s)} tokens/s, {r.step_ms:.1f} ms/step"
    return f"{r.status}: {r.message}" if r.message else r.status


def format_table(
    results: list[protocol.TrialResult], baseline: float | None = None, item_name: str = "tokens"
) -> str:
    """`baseline`: tokens/s that the "x base" column divides by; without it, "x first" divides
    by the first row's. `item_name`: what the workload counts (tokens, images, samples)."""
    base = baseline or next((r.tokens_per_s for r in results if r.tokens_per_s), None)
    headers = ["#", "configuration", f"{item_name}/s", "x base" if baseline else "x first", "step ms",
               "MFU", "peak GiB", "compile s", "loss", "status"]
    rows = []
    for i, r in enumerate(results, start=1):
        ratio = f"{r.tokens_per_s / base:.2f}x" if (r.tokens_per_s and base) else "-"
        loss = {True: "ok", False: "MISMATCH", None: "-"}[r.loss_ok]
        if r.loss_ok is not None and r.loss_max_rel_error is not None:
            loss += f" {r.loss_max_rel_error:.1e}"
        rows.append([
            str(i), r.label,
            fmt.si(r.tokens_per_s) if r.tokens_per_s else "-",
            ratio,
            f"{r.step_ms:.1f}" if r.step_ms else "-",
            f"{r.mfu:.1%}" if r.mfu is not None else "-",
            fmt.gib(r.peak_memory_bytes, unit=False),
            f"{r.compile_s:.1f}" if r.compile_s is not None else "-",
            loss,
            r.status,
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    peaks = sorted({r.mfu_peak_source for r in results if r.mfu_peak_source})
    if peaks:
        lines.append("MFU peaks: " + "; ".join(peaks))
    return "\n".join(lines)


def format_profiles(results: list[protocol.TrialResult]) -> str:
    """Each profiled row's profile: where its step's time goes, the verdict, what to try."""
    lines = []
    for i, r in enumerate(results, start=1):
        if r.profile.get("categories"):
            lines += ["", f"#{i} {r.label}"] + ["  " + line for line in describe(r.profile)]
        elif r.profile.get("error"):
            lines += ["", f"#{i} {r.label}: {r.profile['error']}"]
    return "\n".join(lines)

"""The table that `bench` and `tune` print, and the one-line summary of a trial.

Rendered with rich as plain text: no colour, no wrapping, an ASCII rule under the header, and
numbers right-aligned, so it reads the same on a terminal, in a log file and in CI.
"""

from __future__ import annotations

import shutil
import sys

from tuner_tui import format as fmt
from tuner_tui.engine import protocol
from tuner_tui.engine.noise import is_noisy, spread_text
from tuner_tui.engine.protocol import measured_peak
from tuner_tui.engine.profile import describe


def item_name_of(results: list[protocol.TrialResult]) -> str:
    """What the rows count (tokens, images, samples): the first measured row's item."""
    return next((r.item_name for r in results if r.tokens_per_s), "tokens")


def summary(r: protocol.TrialResult, item_name: str | None = None) -> str:
    """`item_name`: what the workload counts; by default the row's own."""
    if r.status == "ok" and r.tokens_per_s:
        noisy = " (noisy)" if is_noisy(r) else ""
        text = (f"{fmt.si(r.tokens_per_s)} {item_name or r.item_name}/s, {r.step_ms:.1f} ms/step "
                f"{spread_text(r)}{noisy}")
        peak = measured_peak(r)
        if peak:  # in the progress line, so that a log cut short still tells what fitted
            text += f", peak {fmt.size(peak)}" + (" per rank" if r.per_rank else "")
        if r.per_rank:
            ranks = len(r.per_rank)
            text += (f" (slowest of {ranks} ranks; global batch {r.batch_size} = {ranks} x "
                     f"{r.batch_size // ranks}/rank)")
        return text
    return f"{r.status}: {r.message}" if r.message else r.status


def terminal_width() -> int | None:
    """The terminal's width when standard output is one; None (no limit) for a log or a pipe."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((120, 24)).columns


def format_table(
    results: list[protocol.TrialResult], baseline: float | None = None,
    item_name: str | None = None, width: int | None = -1,
) -> str:
    """`baseline`: items/s that the "x base" column divides by; without it, "x first" divides
    by the first row's. `item_name`: what the workload counts (tokens, images, samples); by
    default the rows' own.
    "peak mem" is what counts against a memory budget (the larger of the allocated and reserved
    peaks), as the dashboard shows it; "est mem" the estimate made before the row ran, from the
    rows before it (a run's first row: from its parameters and the model's shapes alone), marked
    ~ where it rests on a saving not measured yet (such an estimate never skips a trial).
    `width`: the widest a line may be (long labels wrap in their column); -1: the terminal's
    when printing to one, None: no limit."""
    base = baseline or next((r.tokens_per_s for r in results if r.tokens_per_s), None)
    item_name = item_name or item_name_of(results)
    headers = ["#", "configuration", f"{item_name}/s", "x base" if baseline else "x first", "step ms",
               "spread", "MFU", "peak mem", "est mem", "compile s", "loss", "status"]
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
            spread_text(r) + ("!" if is_noisy(r) else ""),
            f"{r.mfu:.1%}" if r.mfu is not None else "-",
            _size(measured_peak(r)),
            _estimate(r),
            f"{r.compile_s:.1f}" if r.compile_s is not None else "-",
            loss,
            r.status,
        ])
    width = terminal_width() if width == -1 else width
    headers, rows, dropped = fit_columns(headers, rows, width, NARROW_DROP_ORDER)
    lines = render_columns(headers, rows, width)
    if dropped:
        lines.append(f"(not shown at {width} columns: {', '.join(dropped)}; --json keeps every "
                     "figure)")
    if any(is_noisy(r) for r in results):
        lines.append("spread: half the interquartile range of the step times, relative to the "
                     "median; ! marks a noisy row")
    peaks = sorted({r.mfu_peak_source for r in results if r.mfu_peak_source})
    if peaks:
        lines.append("MFU peaks: " + "; ".join(peaks))
    return "\n".join(lines)


def _size(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else fmt.size(num_bytes)


def _estimate(r: protocol.TrialResult) -> str:
    total = r.memory_estimate.get("total")
    if total is None:
        return "-"
    return ("" if r.memory_estimate.get("certain", True) else "~") + _size(total)


NARROW_DROP_ORDER = ("est mem", "MFU", "compile s", "loss", "step ms", "x first", "x base")
"""The table's columns left out, in this order, where the terminal is too narrow for all."""
LABEL_MIN = 16
"""The configuration column keeps at least this many characters (longer labels wrap)."""


def fit_columns(headers: list[str], rows: list[list[str]], width: int | None,
                drop_order: tuple[str, ...], wrap: str = "configuration"
                ) -> tuple[list[str], list[list[str]], list[str]]:
    """The headers and rows left once columns are dropped so that the table fits in `width`
    with LABEL_MIN characters for the `wrap` column: first the columns with no figure at all,
    then those of `drop_order` in turn. Returns (headers, rows, the headers of the columns with
    figures that were dropped)."""
    if width is None:
        return headers, rows, []

    def needed(keep: list[int]) -> int:
        total = 0
        for i in keep:
            natural = max([len(headers[i])] + [len(r[i]) for r in rows])
            total += min(natural, LABEL_MIN) if headers[i] == wrap else natural
        return total + 2 * (len(keep) - 1)  # a space of padding and one of rule between

    keep = list(range(len(headers)))
    empty = [i for i in keep if rows and all(r[i] == "-" for r in rows) and headers[i] != wrap]
    candidates = empty + [headers.index(h) for h in drop_order if h in headers]
    dropped = []
    for i in candidates:
        if needed(keep) <= width:
            break
        if i in keep:
            keep.remove(i)
            if i not in empty:  # a column with no figure is not missed
                dropped.append(headers[i])
    return ([headers[i] for i in keep], [[r[i] for i in keep] for r in rows], dropped)


def render_columns(headers: list[str], rows: list[list[str]], width: int | None = None,
                   wrap: str = "configuration") -> list[str]:
    """`rows` of cells under `headers`, as lines of text. A column whose cells are all numbers
    (or "-") is right-aligned. With a `width`, the `wrap` column's cells wrap within it so that
    no line is wider (the others never wrap); without one, nothing wraps."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    rule = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    table = Table(box=rule, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    natural = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    for i, header in enumerate(headers):
        cells = [row[i] for row in rows]
        numeric = bool(cells) and all(c == "-" or c.lstrip("~")[:1].isdigit() for c in cells)
        fixed = None
        if width is not None and header == wrap:
            others = sum(n + 2 for j, n in enumerate(natural) if j != i)
            fixed = max(LABEL_MIN, min(natural[i], width - others))
        table.add_column(Text(header), justify="right" if numeric else "left",
                         no_wrap=fixed is None, overflow="fold", width=fixed)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: a label's [..] is not rich markup
    out = io.StringIO()
    Console(file=out, width=width or 100_000, color_system=None, force_terminal=False,
            highlight=False).print(table)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def format_profiles(results: list[protocol.TrialResult]) -> str:
    """Each profiled row's profile: where its step's time goes, the verdict, what to try."""
    lines = []
    for i, r in enumerate(results, start=1):
        if r.profile.get("categories"):
            lines += ["", f"#{i} {r.label}"] + ["  " + line for line in describe(r.profile)]
        elif r.profile.get("error"):
            lines += ["", f"#{i} {r.label}: {r.profile['error']}"]
    return "\n".join(lines)

"""The current run's figures: tokens/s, step time (and each rank's, in a group), MFU and its
peak, memory, compile time."""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.app.session import Session
from tuner_tui.engine.noise import noise_warning, spread


def mfu_peak_text(session: Session) -> str:
    """Which peak MFU is measured against, from the run's result or the worker's environment."""
    result = session.current_result()
    tflops = result.mfu_peak_tflops if result else None
    source = result.mfu_peak_source if result else ""
    if tflops is None:
        tflops = session.environment.get("mfu_peak_tflops")
        source = source or session.environment.get("mfu_peak_source", "")
    if tflops is None:
        return source or "peak not known yet"
    return f"of {tflops:.3g} TFLOP/s" + (f" ({source})" if source else "")


def rank_times_text(rank_step_ms: tuple[float, ...]) -> Text:
    """Each rank's time for the last step, the slowest (the group's step time) in bold."""
    slowest = max(rank_step_ms)
    text = Text()
    for rank, ms in enumerate(rank_step_ms):
        if rank:
            text.append("  ")
        text.append(f"{rank}:", style="dim")
        text.append(fmt.milliseconds(ms), style="bold yellow" if ms == slowest else "")
    return text


def figures_table(session: Session, now: float) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True, min_width=8)
    table.add_column(no_wrap=True, overflow="ellipsis")
    step = session.last_step
    result = session.current_result()
    tokens = Text(fmt.rate(step.tokens_per_s if step else None), style="bold green")
    base = session.baseline
    is_baseline = base is not None and base is session.row_for_run(session.run_id)
    if is_baseline:
        tokens.append("  the baseline", style="dim")
    elif step and base and base.result.tokens_per_s:
        tokens.append(f"  {fmt.speedup(step.tokens_per_s / base.result.tokens_per_s)} baseline", style="")
    table.add_row(f"{session.item_name}/s", tokens)
    median = ""
    if result and result.step_ms:
        median = f"  (median {fmt.milliseconds(result.step_ms)} {fmt.spread(spread(result))})"
    table.add_row("step ms", fmt.milliseconds(step.step_ms if step else None) + median)
    if step and step.rank_step_ms:
        table.add_row("rank ms", rank_times_text(step.rank_step_ms))
    if result and noise_warning(result):
        table.add_row("noise", Text(noise_warning(result), style="bold yellow"))
    mfu = step.mfu if step else None
    table.add_row("MFU", Text(fmt.fraction(mfu)).append(f"  {mfu_peak_text(session)}", style="dim"))
    peak = step.peak_memory_bytes if step else None
    table.add_row("peak mem", fmt.size(peak))
    compiling = session.compiling_for(now)
    if compiling is not None:
        table.add_row("compile", Text(f"compiling… {compiling:.0f}s", style="bold yellow"))
    elif session.run_config.get("compile_mode", "off") == "off":
        table.add_row("compile", Text("eager", style="dim"))
    else:
        compile_s = session.compile_s if session.compile_s is not None else (result.compile_s if result else None)
        table.add_row("compile", fmt.seconds(compile_s))
    table.add_row("loss", fmt.loss(step.loss if step else None))
    seq = session.workload.get("items_per_sample") or session.workload.get("sequence_length")
    batch = f"{session.batch_size} × {seq}" if session.batch_size and seq else (str(session.batch_size or "—"))
    ranks = len(step.rank_step_ms) if step else 0
    if ranks > 1 and session.batch_size:
        batch += f"  ({ranks} ranks × {session.batch_size // ranks})"
    table.add_row("batch", batch)
    table.add_row("step", str(step.step) if step else "—")
    return table


class CurrentFigures(Static):
    """Redrawn by the app's refresh timer from the session."""

    DEFAULT_CSS = """
    CurrentFigures {
        height: auto;
    }
    """

    def show(self, session: Session, now: float | None = None) -> None:
        self.update(figures_table(session, time.monotonic() if now is None else now))

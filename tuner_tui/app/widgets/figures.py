"""The current run's figures: its rate (tokens/s, images/s) and change against the baseline, step
time and spread (and each rank's, in a group), MFU and its peak, peak memory, the first step's
builds. Once the run's row is in, the rate, change, step time and peak are the row's, so the
panel and the leaderboard agree; before, the median of the measured steps so far, marked so."""

from __future__ import annotations

import statistics
import time

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.app.session import Session
from tuner_tui.engine.noise import is_noisy, spread, times_spread


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


def rate_text(session: Session) -> Text:
    """The run's rate and its change against the baseline: the row's figures once it is in
    (the same the leaderboard shows), the median of the measured steps before."""
    rate, measured = session.current_rate()
    text = Text(fmt.rate(rate), style="bold green")
    base = session.baseline
    if base is not None and base is session.current_row():
        text.append("  the baseline", style="dim")
    elif rate and base is not None:
        text.append(f"  {fmt.speedup(session.change(rate))} baseline")
    if rate and not measured:
        text.append("  so far", style="dim")
    return text


def step_text(session: Session) -> Text:
    result = session.current_result()
    step = session.last_step
    text = Text()
    if result is not None and result.step_ms:
        text.append(fmt.milliseconds(result.step_ms))
        text.append(f" {fmt.spread(spread(result))}", style="yellow" if is_noisy(result) else "dim")
    elif session.run_times:
        times = session.run_times
        text.append(fmt.milliseconds(statistics.median(times)))
        text.append(f" {fmt.spread(times_spread(times))}", style="dim")
    else:
        text.append(fmt.UNKNOWN)
    if step is not None:
        text.append(f"  now {fmt.milliseconds(step.step_ms)}", style="dim")
    return text


def noise_text(session: Session) -> Text | None:
    """A short word on noise: more steps being measured, or a noisy row (the leaderboard's
    title says whether rows then tie)."""
    measuring = session.measuring()
    if measuring is not None:
        done, cap = measuring
        if done > session.measure_steps:
            return Text(f"noisy: measuring more steps, {done} of up to {cap}", style="yellow")
        return None
    result = session.current_result()
    if result is not None and is_noisy(result):
        return Text(f"noisy ±{spread(result):.0%} after {result.measured_steps} steps",
                    style="bold yellow")
    return None


def build_text(session: Session, now: float) -> Text:
    """The first step's one-time builds while they run, then their time; "eager" for none."""
    compiling = session.compiling_for(now)
    if compiling is not None:
        return Text(f"building {session.compile_what or 'torch.compile'}… {compiling:.0f}s",
                    style="bold yellow")
    waiting = session.first_step_for(now)
    if waiting is not None:
        return Text(f"first step… {waiting:.0f}s", style="yellow")
    result = session.current_result()
    builds = result.first_step_builds if result is not None else session.compile_what
    if session.run_config.get("compile_mode", "off") == "off" and not builds:
        return Text("eager", style="dim")
    compile_s = session.compile_s if session.compile_s is not None else (result.compile_s if result else None)
    return Text(fmt.seconds(compile_s))


def figures_table(session: Session, now: float) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True, min_width=8)
    table.add_column(overflow="fold")
    step = session.last_step
    table.add_row(f"{session.item_name}/s", rate_text(session))
    table.add_row("step ms", step_text(session))
    if step and step.rank_step_ms:
        table.add_row("rank ms", rank_times_text(step.rank_step_ms))
    noise = noise_text(session)
    if noise is not None:
        table.add_row("noise", noise)
    result = session.current_result()
    mfu = result.mfu if result is not None and result.mfu is not None else (step.mfu if step else None)
    table.add_row("MFU", Text(fmt.fraction(mfu)).append(f"  {mfu_peak_text(session)}", style="dim"))
    peak, measured = session.current_peak()
    peak_text = Text(fmt.size(peak))
    if peak is not None and not measured:
        peak_text.append("  so far", style="dim")
    table.add_row("peak mem", peak_text)
    table.add_row("compile", build_text(session, now))
    table.add_row("loss", fmt.loss(step.loss if step else None))
    seq = session.workload.get("items_per_sample") or session.workload.get("sequence_length")
    batch = f"{session.batch_size} × {seq}" if session.batch_size and seq else (str(session.batch_size or "—"))
    ranks = len(step.rank_step_ms) if step else 0
    if ranks > 1 and session.batch_size:
        batch += f"  ({ranks} ranks × {session.batch_size // ranks})"
    table.add_row("batch", batch + (f"  step {step.step}" if step else ""))
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

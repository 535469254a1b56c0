"""Per-GPU telemetry: utilization, memory, power, temperature, SM clock, GPM activity."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.app.widgets.bars import bar, level_style
from tuner_tui.engine.telemetry import GpuSample, TelemetrySample

BAR_WIDTH = 12


def _ratio(used: float | None, total: float | None) -> float | None:
    if used is None or not total:
        return None
    return used / total


def describe_gpu(gpu: GpuSample) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"GPU {gpu.index} ", style="bold")
    text.append(f"{gpu.name}\n", style="bold cyan")
    util = None if gpu.utilization_pct is None else gpu.utilization_pct / 100
    text.append("util  ")
    text.append_text(bar(util, BAR_WIDTH, level_style(None)))
    text.append(f" {fmt.percent(gpu.utilization_pct)}\n")
    memory = _ratio(gpu.memory_used_bytes, gpu.memory_total_bytes)
    text.append("mem   ")
    text.append_text(bar(memory, BAR_WIDTH, level_style(memory)))
    text.append(f" {fmt.size(gpu.memory_used_bytes)} / {fmt.size(gpu.memory_total_bytes)}\n")
    power = _ratio(gpu.power_w, gpu.power_limit_w)
    text.append("power ")
    text.append_text(bar(power, BAR_WIDTH, level_style(power)))
    watts = "—" if gpu.power_w is None else f"{gpu.power_w:.0f}"
    limit = "—" if gpu.power_limit_w is None else f"{gpu.power_limit_w:.0f}"
    text.append(f" {watts} / {limit} W\n")
    temp = "—" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
    clock = "—" if gpu.sm_clock_mhz is None else f"{gpu.sm_clock_mhz}"
    clock_max = "" if gpu.sm_clock_max_mhz is None else f"/{gpu.sm_clock_max_mhz}"
    text.append(f"temp  {temp}   SM clock {clock}{clock_max} MHz\n")
    if gpu.sm_activity_pct is not None or gpu.tensor_activity_pct is not None:
        text.append(
            f"SM active {fmt.percent(gpu.sm_activity_pct)}   "
            f"tensor {fmt.percent(gpu.tensor_activity_pct)}"
        )
    else:
        text.append(gpu.gpm_note or "GPM: waiting for a second sample", style="dim")
    return text


COMPACT_FROM = 3
"""From this many GPUs on, one line per GPU."""


def describe_gpu_line(gpu: GpuSample) -> Text:
    """One GPU in one line, for machines with several."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{gpu.index} ", style="bold")
    util = None if gpu.utilization_pct is None else gpu.utilization_pct / 100
    text.append_text(bar(util, 5))
    text.append(f"{fmt.percent(gpu.utilization_pct):>5} ")
    memory = _ratio(gpu.memory_used_bytes, gpu.memory_total_bytes)
    text.append(f"mem {fmt.percent(None if memory is None else 100 * memory):>4} ", style=level_style(memory))
    watts = "—" if gpu.power_w is None else f"{gpu.power_w:.0f}W"
    temp = "—" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
    text.append(f"{watts:>5} {temp:>5}")
    if gpu.tensor_activity_pct is not None:
        text.append(f" tc {gpu.tensor_activity_pct:.0f}%")
    return text


class GpuPanel(Static):
    """One block per GPU, or the reason there is none."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
    }
    """

    sample: reactive[TelemetrySample | None] = reactive(None, always_update=True)
    """The latest telemetry sample; None until the sampler has run."""

    def watch_sample(self, sample: TelemetrySample | None) -> None:
        if sample is None:
            self.update(Text("sampling…", style="dim"))
            return
        if not sample.gpus:
            self.update(Text(sample.gpu_unavailable or "no GPU", style="yellow"))
            return
        text = Text()
        compact = len(sample.gpus) >= COMPACT_FROM
        if compact:
            text.append(f"{len(sample.gpus)} × {sample.gpus[0].name}\n", style="bold cyan")
        for i, gpu in enumerate(sample.gpus):
            if i:
                text.append("\n")
            text.append_text(describe_gpu_line(gpu) if compact else describe_gpu(gpu))
        self.update(text)

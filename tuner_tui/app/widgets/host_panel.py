"""The worker process (and its compile workers) and the host: CPU and memory."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.app.widgets.bars import bar, level_style
from tuner_tui.engine.telemetry import TelemetrySample

BAR_WIDTH = 12


def describe_host(sample: TelemetrySample) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    process = sample.process
    host = sample.host
    if process is None:
        text.append(f"worker: {sample.process_note or 'not running'}\n", style="yellow")
    else:
        cores = host.cpu_count if host else 1
        text.append(f"worker pid {process.pid}")
        if process.children:
            text.append(f" (+{process.children} children)", style="dim")
        text.append("\ncpu   ")
        cpu = process.cpu_percent / (100 * cores)
        text.append_text(bar(cpu, BAR_WIDTH, level_style(None)))
        text.append(f" {process.cpu_percent:.0f}% of {cores} cores\n")
        text.append(f"rss   {fmt.size(process.rss_bytes)}   threads {process.threads}\n")
    if host is not None:
        memory = host.memory_used_bytes / host.memory_total_bytes if host.memory_total_bytes else None
        text.append("host  ")
        text.append_text(bar(host.cpu_percent / 100, BAR_WIDTH, level_style(None)))
        text.append(f" cpu {host.cpu_percent:.0f}%\n")
        text.append("mem   ")
        text.append_text(bar(memory, BAR_WIDTH, level_style(memory)))
        text.append(f" {fmt.size(host.memory_used_bytes)} / {fmt.size(host.memory_total_bytes)}")
    return text


class HostPanel(Static):
    """CPU and memory of the worker process and of the machine."""

    DEFAULT_CSS = """
    HostPanel {
        height: auto;
    }
    """

    sample: reactive[TelemetrySample | None] = reactive(None, always_update=True)
    """The latest telemetry sample; None until the sampler has run."""

    def watch_sample(self, sample: TelemetrySample | None) -> None:
        self.update(Text("sampling…", style="dim") if sample is None else describe_host(sample))

"""The current run's peak memory, split into parameters, gradients, optimizer state, and the
activations and the rest, against the memory budget when one is set (`gputune --max-memory`).

The parts are what the worker measured on the device after the first optimizer step
(`TrialResult.memory_parts`); the rest is the measured peak less those.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.engine.protocol import TrialResult, measured_peak

PARTS = (
    ("parameters", "params", "cyan"),
    ("gradients", "grads", "magenta"),
    ("optimizer_state", "optim", "yellow"),
    ("activations", "activ+rest", "green"),
)


def memory_split(result: TrialResult | None) -> dict[str, int] | None:
    """The peak's parts in bytes (keys of PARTS), or None before the run measured them. The
    peak is the one the leaderboard and bench show (`measured_peak`)."""
    peak = measured_peak(result) if result is not None else None
    if result is None or not result.memory_parts or not peak:
        return None
    parts = {key: int(result.memory_parts.get(key, 0)) for key, _, _ in PARTS[:3]}
    parts["activations"] = max(0, peak - sum(parts.values()))
    return parts


def stacked_bar(parts: dict[str, int], scale: int, width: int) -> Text:
    """One cell row: each part's share of `scale` in its colour, the unused rest dim."""
    text = Text(no_wrap=True)
    used = 0
    for key, _, style in PARTS:
        cells = round(parts[key] / scale * width) if scale else 0
        cells = min(cells, width - used)
        text.append("█" * cells, style=style)
        used += cells
    text.append("░" * (width - used), style="dim")
    return text


def memory_table(result: TrialResult | None, budget: int | None, width: int = 30) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(overflow="fold")
    parts = memory_split(result)
    if parts is None:
        peak = measured_peak(result) if result else None
        table.add_row(Text(f"peak {fmt.size(peak)}; split after the measured steps", style="dim"))
        return table
    peak = sum(parts.values())
    scale = max(peak, budget or 0)
    table.add_row(stacked_bar(parts, scale, width))
    # Two to a line where they fit, else one: no part is cut.
    groups = (PARTS[:2], PARTS[2:]) if width >= 36 else tuple((p,) for p in PARTS)
    for group in groups:
        legend = Text(no_wrap=True)
        for key, name, style in group:
            legend.append("■ ", style=style).append(f"{name} {fmt.size(parts[key])}  ")
        table.add_row(legend)
    line = Text(f"peak {fmt.size(peak)}")
    if budget:
        over = peak > budget
        line.append(f" of {fmt.size(budget)} budget", style="bold red" if over else "")
        line.append("  over" if over else f"  {fmt.size(budget - peak)} free",
                    style="bold red" if over else "dim")
    table.add_row(line)
    return table


class MemoryPanel(Static):
    """Redrawn by the app's refresh timer from the current run's result."""

    DEFAULT_CSS = """
    MemoryPanel {
        height: auto;
    }
    """

    def show(self, result: TrialResult | None, budget: int | None = None) -> None:
        width = max(10, (self.size.width or 32) - 2)
        self.update(memory_table(result, budget, width))

"""The full configuration of the selected leaderboard row, with its figures and message."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from strategies.registry import OPTIONS
from tuner_tui import format as fmt
from tuner_tui.app.session import Row


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(value) if value else "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_table(row: Row) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    result = row.result
    table.add_row("run", Text(f"{row.number}: {result.label}", style="bold"))
    for key, option in OPTIONS.items():
        value = result.config.get(key, option.default)
        changed = _shown(value) != _shown(option.default)
        table.add_row(key, Text(_shown(value), style="bold cyan" if changed else ""))
    table.add_row("status", Text(result.status, style="green" if result.status == "ok" else "red"))
    if result.loss_ok is not None:
        tol = f" (max rel. error {result.loss_max_rel_error:.2g}, tolerance {result.loss_tolerance:.2g})" if (
            result.loss_max_rel_error is not None and result.loss_tolerance is not None
        ) else ""
        table.add_row("loss check", ("ok" if result.loss_ok else "off reference") + tol)
    if result.peak_reserved_bytes is not None:
        table.add_row("reserved", fmt.size(result.peak_reserved_bytes))
    if result.message:
        table.add_row("message", Text(result.message, style="yellow"))
    return table


class ConfigView(Static):
    """Shows one row; `show(None)` says what to do instead."""

    def show(self, row: Row | None) -> None:
        if row is None:
            self.update(Text("Select a leaderboard row to see its configuration.", style="dim"))
        else:
            self.update(config_table(row))

"""This machine's history: trials measured before (by the dashboard, its search, `gputune tune`
and `gputune bench`, with this code) for this workload, from the result store; Enter re-applies
one."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from tuner_tui import format as fmt
from tuner_tui.engine.noise import spread
from tuner_tui.engine.protocol import measured_peak


def load_history(environment: dict, description: dict) -> tuple[list, str, str]:
    """(trials measured before on this machine for this workload, newest first; the workload's
    store key; why none could be read, or "")."""
    trials, problem, workload = [], "", ""
    try:
        from tuner_tui.engine.store import ResultStore, StoreError, workload_key

        workload = workload_key(description) if description.get("name") else ""
        try:
            with ResultStore() as store:
                trials = store.past(environment, workload or None, limit=500)
        except StoreError as exc:
            problem = str(exc)
    except ImportError as exc:
        problem = f"no result store: {exc}"
    return trials, workload, problem


def _when(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


class HistoryScreen(ModalScreen[dict | None]):
    """Dismisses with the chosen trial's configuration (a dict), or None."""

    DEFAULT_CSS = """
    HistoryScreen {
        align: center middle;
    }
    HistoryScreen > Vertical {
        width: 90%;
        height: 80%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    HistoryScreen DataTable {
        height: 1fr;
    }
    HistoryScreen #history-note {
        color: $text-muted;
    }
    """

    BINDINGS = [
        Binding("escape,h", "close", "Close"),
        Binding("enter", "choose", "Re-apply", priority=True),
    ]

    def __init__(self, trials: list[Any], where: str, problem: str = "",
                 item_name: str = "tokens") -> None:
        super().__init__()
        self.trials = trials
        self.where = where
        self.problem = problem
        self.item_name = item_name

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Measured before on {self.where}", classes="title")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="history")
            note = self.problem or (
                "Enter re-applies the selected configuration; Esc closes."
                if self.trials
                else "Nothing measured here yet: the dashboard's runs and searches, gputune tune "
                     "and gputune bench fill this list. Esc closes."
            )
            yield Static(note, id="history-note")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for header in ("when", "by", "configuration", f"{self.item_name}/s", "step ms", "±", "MFU",
                       "peak mem", "status"):
            table.add_column(header)
        for index, trial in enumerate(self.trials):
            r = trial.result
            table.add_row(
                _when(trial.created),
                Text(getattr(trial, "source", ""), style="dim"),
                r.label,
                Text(fmt.rate(r.tokens_per_s), justify="right"),
                Text(fmt.milliseconds(r.step_ms), justify="right"),
                Text(fmt.spread(spread(r)), justify="right"),
                Text(fmt.fraction(r.mfu), justify="right"),
                Text(fmt.size(measured_peak(r)), justify="right"),
                Text(r.status, style="green" if r.status == "ok" else "red"),
                key=str(index),
            )
        table.focus()

    def action_choose(self) -> None:
        table = self.query_one(DataTable)
        if not self.trials or table.row_count == 0:
            self.dismiss(None)
            return
        self.dismiss(dict(self.trials[table.cursor_row].config))

    def action_close(self) -> None:
        self.dismiss(None)

"""The log view (key l): what the worker and the libraries it runs said (torch, torchao, triton,
transformers warnings), and the dashboard's own errors, newest last. None of it is drawn over the
dashboard: the worker writes its output to the run's log file, named at the top."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import RichLog, Static

LEVEL_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
REFRESH_S = 0.5


def log_line(line: Any) -> Text:
    text = Text()
    text.append(f"{line.level:<7} ", style=LEVEL_STYLE.get(line.level, ""))
    text.append(f"{line.source}: ", style="bold")
    text.append(line.text)
    return text


class LogScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    LogScreen {
        align: center middle;
    }
    LogScreen > Vertical {
        width: 95%;
        height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    LogScreen #log-note {
        color: $text-muted;
        height: auto;
    }
    LogScreen RichLog {
        height: 1fr;
    }
    """

    BINDINGS = [Binding("escape,l,q", "close", "Close")]

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self._shown = 0

    def compose(self) -> ComposeResult:
        with Vertical():
            path = self.session.log_path
            where = f"The worker's full output: {path}" if path else "The worker's output goes to its terminal."
            yield Static(f"Log (Esc closes). {where}", id="log-note")
            yield RichLog(wrap=True, markup=False, highlight=False, id="log")

    def on_mount(self) -> None:
        self._append_new()
        self.set_interval(REFRESH_S, self._append_new)

    def _append_new(self) -> None:
        added = self.session.logs_added
        log = self.query_one(RichLog)
        if added == 0:
            if self._shown == 0:
                log.write(Text("Nothing logged yet.", style="dim"))
                self._shown = -1
            return
        if self._shown == -1:
            log.clear()
            self._shown = 0
        new = added - self._shown
        if new > 0:
            for line in list(self.session.logs)[-new:]:
                log.write(log_line(line))
            self._shown = added

    def action_close(self) -> None:
        self.dismiss(None)

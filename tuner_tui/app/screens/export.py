"""The export dialog: a path and a format for the selected row (or the current configuration)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet, Static

DEFAULT_PATH = "gputune.toml"


@dataclass(frozen=True)
class ExportRequest:
    path: str
    fmt: str
    """toml or json."""


def with_suffix_for(path: str, fmt: str) -> str:
    """Swap a .toml/.json suffix to match the chosen format; leave other names alone."""
    p = Path(path)
    if p.suffix.lower() in (".toml", ".json"):
        return str(p.with_suffix("." + fmt))
    return path


class ExportScreen(ModalScreen[ExportRequest | None]):
    """Dismisses with an ExportRequest, or None when cancelled."""

    DEFAULT_CSS = """
    ExportScreen {
        align: center middle;
    }
    ExportScreen > Vertical {
        width: 64;
        height: auto;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    ExportScreen #export-what {
        margin-bottom: 1;
    }
    ExportScreen RadioSet {
        layout: horizontal;
        width: 100%;
        height: auto;
        margin: 1 0 0 0;
    }
    ExportScreen RadioButton {
        width: 12;
    }
    ExportScreen #export-buttons {
        height: auto;
        align-horizontal: right;
    }
    ExportScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, what: str, path: str = DEFAULT_PATH, fmt: str = "toml") -> None:
        super().__init__()
        self.what = what
        self.initial_path = path
        self.initial_fmt = fmt

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Export configuration", classes="title")
            yield Static(self.what, id="export-what")
            yield Input(self.initial_path, id="export-path", placeholder="path")
            with RadioSet(id="export-format"):
                yield RadioButton("TOML", value=self.initial_fmt == "toml", id="fmt-toml")
                yield RadioButton("JSON", value=self.initial_fmt == "json", id="fmt-json")
            with Horizontal(id="export-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Export", id="export", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#export-path", Input).focus()

    @property
    def fmt(self) -> str:
        pressed = self.query_one(RadioSet).pressed_button
        return "json" if pressed is not None and pressed.id == "fmt-json" else "toml"

    @on(RadioSet.Changed)
    def _format_changed(self, event: RadioSet.Changed) -> None:
        path_input = self.query_one("#export-path", Input)
        path_input.value = with_suffix_for(path_input.value, self.fmt)

    @on(Input.Submitted)
    @on(Button.Pressed, "#export")
    def _export(self) -> None:
        path = self.query_one("#export-path", Input).value.strip()
        if not path:
            self.notify("Give a path to export to.", severity="error")
            return
        self.dismiss(ExportRequest(path, self.fmt))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

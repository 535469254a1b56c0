"""The export dialog: a path and a format for the selected row (or the current configuration).

gputune's own file (TOML or JSON), or the file a trainer reads (`strategies.exports`). A file
already at the path is kept as NAME.1 (then .2, ...) by the export; the dialog says so before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet, Static

from strategies.exports import TRAINER_NAMES
from strategies.files import kept_name

DEFAULT_PATH = "gputune.toml"
FORMATS = {"toml": "TOML", "json": "JSON", "hf": "HF", "accelerate": "Accelerate",
           "lightning": "Lightning"}
"""The formats offered, by `strategies.config.save`'s name, with their buttons' labels."""
ENDINGS = {"toml": ".toml", "json": ".json", "hf": "-hf.yaml", "accelerate": "-accelerate.yaml",
           "lightning": "-lightning.yaml"}
"""How a file of each format is named: gputune.toml, gputune-hf.yaml (as `--format` names it)."""


@dataclass(frozen=True)
class ExportRequest:
    path: str
    fmt: str
    """A key of `FORMATS`: toml, json, hf, accelerate or lightning."""


def with_suffix_for(path: str, fmt: str) -> str:
    """Swap a known ending (.toml, .json, -hf.yaml, ...) for the chosen format's; leave other
    names alone."""
    p = Path(path)
    for ending in sorted(ENDINGS.values(), key=len, reverse=True):
        if p.name.lower().endswith(ending) and len(p.name) > len(ending):
            return str(p.with_name(p.name[: -len(ending)] + ENDINGS[fmt]))
    return path


def note_for(path: str, fmt: str) -> str:
    """The line under the path: what the format is for, and the file it will keep."""
    what = (f"{TRAINER_NAMES[fmt]} (YAML; its comments list what has no field)"
            if fmt in TRAINER_NAMES else "gputune's file: gputune.load, --config, --compare")
    target = Path(path.strip()) if path.strip() else None
    if target is not None and target.is_file():
        return f"{what}\n{target.name} exists: it will be kept as {kept_name(target).name}"
    return what


class ExportScreen(ModalScreen[ExportRequest | None]):
    """Dismisses with an ExportRequest, or None when cancelled."""

    DEFAULT_CSS = """
    ExportScreen {
        align: center middle;
    }
    ExportScreen > Vertical {
        width: 76;
        height: auto;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    ExportScreen #export-what {
        margin-bottom: 1;
    }
    ExportScreen #export-note {
        color: $text-muted;
        margin-top: 1;
    }
    ExportScreen RadioSet {
        layout: horizontal;
        width: 100%;
        height: auto;
        margin: 1 0 0 0;
    }
    ExportScreen RadioSet > RadioButton {
        width: auto;
        margin-right: 2;
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
                for fmt, label in FORMATS.items():
                    yield RadioButton(label, value=self.initial_fmt == fmt, id=f"fmt-{fmt}")
            yield Static(note_for(self.initial_path, self.initial_fmt), id="export-note")
            with Horizontal(id="export-buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Export", id="export", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#export-path", Input).focus()

    @property
    def fmt(self) -> str:
        pressed = self.query_one(RadioSet).pressed_button
        return pressed.id.removeprefix("fmt-") if pressed is not None and pressed.id else "toml"

    @on(RadioSet.Changed)
    def _format_changed(self, event: RadioSet.Changed) -> None:
        path_input = self.query_one("#export-path", Input)
        path_input.value = with_suffix_for(path_input.value, self.fmt)
        self._show_note()

    @on(Input.Changed, "#export-path")
    def _show_note(self) -> None:
        path = self.query_one("#export-path", Input).value
        self.query_one("#export-note", Static).update(note_for(path, self.fmt))

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

"""The dashboard's control for each kind of option, chosen by the option's `widget` hint: a
Select for a choice, a Switch for a flag, an Input for a number, one Checkbox per choice for a
set. Each control builds its widget, lists the widgets that take input, reads the value the
user set and shows a value."""

from __future__ import annotations

from typing import Any

from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Select, Switch

from strategies.config import ConfigError
from strategies.registry import Option


class SelectControl:
    def __init__(self, option: Option) -> None:
        self.option = option
        self.id = f"opt-{option.key}"

    def build(self, value: Any) -> Widget:
        return Select([(str(c), c) for c in self.option.choices], value=value, allow_blank=False,
                      compact=True, id=self.id, classes="option-control")

    def inputs(self, root: Widget) -> list[Widget]:
        """The widgets of `root` (this control's widget) that take the user's input."""
        return [root]

    def read(self, root: Widget) -> Any:
        return root.value

    def write(self, root: Widget, value: Any) -> None:
        root.value = value

    def stays_editable(self, widget: Widget) -> bool:
        """Whether `widget` stays enabled although the option is unavailable here (so that a
        value already set can be taken back)."""
        return False


class SwitchControl(SelectControl):
    def build(self, value: Any) -> Widget:
        return Switch(value=bool(value), animate=False, id=self.id, classes="option-control")


class NumberControl(SelectControl):
    def build(self, value: Any) -> Widget:
        return Input(value=self.option.show(value), type=self.option.input_type, compact=True,
                     id=self.id, classes="option-control")

    def read(self, root: Widget) -> Any:
        text = root.value.strip()
        if not text:
            raise ConfigError(f"{self.option.key} is empty: {self.option.describe_allowed()}")
        return self.option.parse(text)

    def write(self, root: Widget, value: Any) -> None:
        root.value = self.option.show(value)


class CheckboxesControl(SelectControl):
    def build(self, value: Any) -> Widget:
        boxes = [Checkbox(choice, value=choice in value, id=f"{self.id}--{choice}", compact=True)
                 for choice in self.option.choices]
        return Vertical(*boxes, classes="set-choices option-control", id=self.id)

    def inputs(self, root: Widget) -> list[Widget]:
        return list(root.query(Checkbox))

    def read(self, root: Widget) -> Any:
        return tuple(c for c, box in zip(self.option.choices, self.inputs(root)) if box.value)

    def write(self, root: Widget, value: Any) -> None:
        for choice, box in zip(self.option.choices, self.inputs(root)):
            box.value = choice in value

    def stays_editable(self, widget: Widget) -> bool:
        return bool(getattr(widget, "value", False))


CONTROLS = {"select": SelectControl, "switch": SwitchControl, "number": NumberControl,
            "checkboxes": CheckboxesControl}
"""One control per `Option.widget` hint."""


def control_for(option: Option) -> SelectControl:
    return CONTROLS[option.widget](option)

"""The options panel, generated from the strategy registry.

One row per option, its control chosen by the option's widget hint (`option_controls`): a
Select, a Switch, an Input for numbers, one Checkbox per choice for a set. Options (or single
choices) this machine cannot run are disabled or marked, and the help line under the panel
says why; so are those that change nothing in the model the worker built (attention in a CNN:
`strategies.applicability`), with the reason under the option. Rows whose value differs from
the applied configuration are marked, so pending changes are visible before Apply.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.css.query import NoMatches
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, Switch

from strategies.config import ConfigError, TuneConfig
from strategies.registry import (
    OPTIONS, STRATEGIES, Capabilities, ChoiceOption, Option, option_unavailable,
)
from tuner_tui.app.widgets.option_controls import control_for

UNAVAILABLE_MARK = " ✗"
NOT_USED_MARK = " (not used)"
CHANGES_TRAINING = "changes how this model trains (the gradient gate refuses it): "


def option_reason(option: Option, caps: Capabilities | None) -> str | None:
    """Why this option cannot be changed from its default on this machine, or None. (A choice
    is judged choice by choice: `choice_reasons`.)"""
    if caps is None or isinstance(option, ChoiceOption):
        return None
    return option_unavailable(option, option.probe(), caps)


def short_reason(option: Option, caps: Capabilities | None) -> str:
    """The missing capability's own reason, for the line under a disabled option."""
    if caps is None:
        return ""
    missing = [need for need in option.requires if not caps.has(need)]
    return caps.why_not(missing[0]) if missing else ""


def choice_reasons(option: Option, caps: Capabilities | None) -> dict[Any, str]:
    if caps is None or not isinstance(option, ChoiceOption):
        return {}
    reasons = {}
    for choice in option.choices:
        reason = option_unavailable(option, choice, caps)
        if reason:
            reasons[choice] = reason
    return reasons


class TogglesPanel(Widget):
    """Holds a draft configuration in its widgets; Apply posts `ApplyRequested`."""

    DEFAULT_CSS = """
    TogglesPanel {
        layout: vertical;
    }
    TogglesPanel > VerticalScroll {
        height: 1fr;
    }
    TogglesPanel .strategy-title {
        color: $text-muted;
        text-style: bold;
        margin-top: 1;
    }
    TogglesPanel .option-row {
        height: auto;
    }
    TogglesPanel .option-label {
        width: 17;
        padding: 0 1 0 0;
    }
    TogglesPanel .option-row.-changed .option-label {
        color: $warning;
        text-style: bold;
    }
    TogglesPanel .option-row.-unavailable .option-label {
        color: $error;
    }
    TogglesPanel .option-row.-not-used .option-label {
        color: $text-disabled;
    }
    TogglesPanel .option-control {
        width: 1fr;
    }
    TogglesPanel .option-row.-set {
        layout: vertical;
    }
    TogglesPanel .option-row.-set .set-choices {
        width: 1fr;
        padding-left: 2;
    }
    TogglesPanel Select, TogglesPanel Input {
        width: 1fr;
    }
    TogglesPanel Switch {
        border: none;
        height: 1;
        padding: 0;
        width: 6;
    }
    TogglesPanel Checkbox {
        border: none;
        height: 1;
        padding: 0;
        background: transparent;
    }
    TogglesPanel .option-why {
        display: none;
        color: $error 80%;
        padding: 0 0 0 2;
        height: auto;
    }
    TogglesPanel .option-why.-not-used {
        color: $text-muted;
    }
    TogglesPanel .set-choices {
        height: auto;
    }
    TogglesPanel #option-help {
        height: 5;
        color: $text-muted;
        padding: 0 1;
        border-top: solid $primary-background;
    }
    TogglesPanel #option-help.-problem {
        color: $error;
    }
    TogglesPanel #apply-row {
        height: auto;
        align-horizontal: right;
    }
    """

    capabilities: reactive[Capabilities | None] = reactive(None, init=False)
    """What the worker's machine can run; None until the worker is ready."""
    inapplicable: reactive[dict[str, str]] = reactive(dict, init=False)
    """The options (`KEY`) and choices (`KEY=CHOICE`) that change nothing in the worker's
    model, with the reason (`strategies.applicability.inapplicable_options` of its
    description); {} until the worker is ready."""
    changes_training: reactive[dict[str, str]] = reactive(dict, init=False)
    """The options that would train the worker's model differently beyond rounding, with the
    reason (`strategies.applicability.training_changing_options`: micro-batches under
    BatchNorm); they stay editable, and the gradient gate refuses their runs."""

    class ApplyRequested(Message):
        """The user asked to apply the draft; `config` is validated, `problem` says why not."""

        def __init__(self, config: TuneConfig | None, problem: str = "") -> None:
            super().__init__()
            self.config = config
            self.problem = problem

    def __init__(self, config: TuneConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.applied = config
        self._initial = config
        self._owner: dict[Widget, str] = {}
        self._reasons: dict[str, str] = {}
        self._choice_reasons: dict[str, dict] = {}
        self._controls = {key: control_for(option) for key, option in OPTIONS.items()}
        self._focused_key: str | None = None
        self._syncing = False

    # -- building --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        values = dict(self._initial.values)
        with VerticalScroll(id="options"):
            for strategy in STRATEGIES:
                yield Static(strategy.name, classes="strategy-title")
                for option in strategy.options:
                    control = self._controls[option.key].build(values[option.key])
                    # A set's checkboxes go under its label, so long choices are not cut.
                    row_classes = "option-row -set" if option.widget == "checkboxes" else "option-row"
                    with Horizontal(classes=row_classes, id=f"row-{option.key}"):
                        yield Label(option.label or option.key, classes="option-label")
                        yield control
                    # Disabled widgets cannot take focus, so their reason is shown in place.
                    yield Static(classes="option-why", id=f"why-{option.key}")
        yield Static(id="option-help")
        with Horizontal(id="apply-row"):
            yield Button("Apply", id="apply", variant="primary", compact=True)

    def on_mount(self) -> None:
        for option in OPTIONS.values():
            for widget in self._widgets_of(option):
                self._owner[widget] = option.key
        self._show_help(None)
        self._mark_changes()

    def _root(self, option: Option) -> Widget:
        return self.query_one(f"#opt-{option.key}")

    def _widgets_of(self, option: Option) -> list[Widget]:
        return self._controls[option.key].inputs(self._root(option))

    # -- reading and writing the draft -----------------------------------------------------------
    def read_value(self, option: Option) -> Any:
        return self._controls[option.key].read(self._root(option))

    def draft(self) -> TuneConfig:
        """The configuration the widgets show; ConfigError names the bad option."""
        return TuneConfig.from_dict({key: self.read_value(o) for key, o in OPTIONS.items()})

    def set_config(self, config: TuneConfig, applied: bool = True) -> None:
        """Show `config` in the widgets (after a re-apply or a load)."""
        self._syncing = True
        try:
            for key, value in config.values:
                self._controls[key].write(self._root(OPTIONS[key]), value)
        finally:
            self._syncing = False
        if applied:
            self.applied = config
        self._mark_changes()

    def mark_applied(self, config: TuneConfig) -> None:
        """A run of `config` started. The widgets follow it unless the user has edits that are
        not applied yet (a run started by the search, a re-applied row or a restart would
        otherwise leave the panel showing the previous configuration)."""
        try:
            untouched = self.draft() == self.applied
        except ConfigError:
            untouched = False  # a half-typed number: keep the user's edit
        if untouched:
            self.set_config(config)
        else:
            self.applied = config
            self._mark_changes()

    def _mark_changes(self) -> None:
        applied = dict(self.applied.values)
        for key, option in OPTIONS.items():
            try:
                row = self.query_one(f"#row-{key}")
            except NoMatches:
                return  # a worker event that arrived while the app shuts down: rows are gone
            try:
                value = self.read_value(option)
                shown = option.show(value)
            except ConfigError:
                value = shown = None  # a half-typed number: differs from any applied value
            row.set_class(shown != option.show(applied[key]), "-changed")
            unavailable = bool(self._reasons.get(key)) or value in self._choice_reasons.get(key, {})
            row.set_class(unavailable, "-unavailable")

    # -- capabilities and what the model uses ----------------------------------------------------
    def watch_capabilities(self, caps: Capabilities | None) -> None:
        self._refresh_availability()

    def watch_inapplicable(self, inapplicable: dict[str, str]) -> None:
        self._refresh_availability()

    def watch_changes_training(self, changes: dict[str, str]) -> None:
        self._refresh_availability()

    def _refresh_availability(self) -> None:
        """Disable and explain what this machine cannot run and what the model does not use (a
        widget that holds a value other than the default stays editable, to take it back)."""
        caps, not_used = self.capabilities, self.inapplicable
        self._reasons.clear()
        self._choice_reasons.clear()
        for key, option in OPTIONS.items():
            reason = option_reason(option, caps)
            unused = not_used.get(key)
            widgets = self._widgets_of(option)
            if reason:
                self._reasons[key] = reason
            for widget in widgets:
                widget.disabled = bool(reason or unused) and not self._controls[key].stays_editable(widget)
                widget.tooltip = reason or unused
            changes = self.changes_training.get(key)
            why = self.query_one(f"#why-{key}", Static)
            why.update(f"✗ unavailable: {short_reason(option, caps)}" if reason
                       else f"not used by this model: {unused}" if unused
                       else f"{CHANGES_TRAINING}{changes}" if changes else "")
            why.set_class(not reason and bool(unused or changes), "-not-used")
            why.display = bool(reason or unused or changes)
            self.query_one(f"#row-{key}").set_class(bool(unused), "-not-used")
            choices = getattr(option, "choices", None) or ()
            unused_choices = {c: not_used[f"{key}={c}"] for c in choices if f"{key}={c}" in not_used}
            reasons = choice_reasons(option, caps)
            if reasons:
                self._choice_reasons[key] = reasons
            if isinstance(option, ChoiceOption) and (reasons or unused_choices):
                select = widgets[0]
                current = select.value
                select.set_options([(str(c) + (UNAVAILABLE_MARK if c in reasons else "")
                                     + (NOT_USED_MARK if c in unused_choices else ""), c)
                                    for c in option.choices])
                select.value = current
            elif not isinstance(option, ChoiceOption) and len(widgets) == len(choices):
                for choice, box in zip(choices, widgets):  # one checkbox per member of a set
                    box.label = str(choice) + (NOT_USED_MARK if choice in unused_choices else "")
                    if choice in unused_choices and not reason:
                        box.disabled = not box.value
                        box.tooltip = unused_choices[choice]
        self._mark_changes()
        self._show_help(self._focused_key)

    # -- help line -------------------------------------------------------------------------------
    def _show_help(self, key: str | None) -> None:
        help_line = self.query_one("#option-help", Static)
        if key is None:
            help_line.update(Text("Change options, then Apply (a). Tab moves between options.", style="dim"))
            help_line.set_class(False, "-problem")
            return
        option = OPTIONS[key]
        problem = self._reasons.get(key)
        if problem is None:
            try:
                value = self.read_value(option)
            except ConfigError as exc:
                problem = str(exc)
            else:
                problem = self._choice_reasons.get(key, {}).get(value)
        text = Text()
        if problem:
            # The reason first: the help line is short and the reason is what matters now.
            text.append(f"✗ {problem}\n", style="bold")
        elif self._not_used(key):
            text.append(f"not used by this model: {self._not_used(key)}\n", style="italic")
        elif key in self.changes_training:
            text.append(f"{CHANGES_TRAINING}{self.changes_training[key]}\n", style="italic")
        text.append(f"{key}: ", style="bold")
        text.append(option.help)
        help_line.update(text)
        help_line.set_class(bool(problem), "-problem")

    def _not_used(self, key: str) -> str | None:
        """Why the option, or the value it shows, changes nothing in the model; None if it may."""
        if key in self.inapplicable:
            return self.inapplicable[key]
        try:
            value = self.read_value(OPTIONS[key])
        except ConfigError:
            return None
        members = value if isinstance(value, tuple) else (value,)
        found = [f"{v}: {self.inapplicable[f'{key}={v}']}" for v in members
                 if f"{key}={v}" in self.inapplicable]
        return "; ".join(found) or None

    def on_descendant_focus(self, event: Any) -> None:
        key = self._owner.get(event.widget)
        if key is not None:
            self._focused_key = key
            self._show_help(key)

    # -- changes ---------------------------------------------------------------------------------
    def _changed(self, widget: Widget) -> None:
        if self._syncing:
            return
        key = self._owner.get(widget)
        self._mark_changes()
        # Programmatic changes (set_config) arrive here too; only the user's own move the help.
        if key is not None and (widget.has_focus or widget.has_focus_within):
            self._focused_key = key
            self._show_help(key)
        elif self._focused_key is not None:
            self._show_help(self._focused_key)

    @on(Select.Changed)
    @on(Switch.Changed)
    @on(Checkbox.Changed)
    @on(Input.Changed)
    def _on_control_changed(self, event: Message) -> None:
        event.stop()
        self._changed(event.control)

    @on(Input.Submitted)
    def _on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.request_apply()

    @on(Button.Pressed, "#apply")
    def _on_apply_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.request_apply()

    def request_apply(self) -> None:
        try:
            config = self.draft()
        except ConfigError as exc:
            self.post_message(self.ApplyRequested(None, str(exc)))
            return
        self.post_message(self.ApplyRequested(config))

"""The options panel shows what the model does not use, with the reason, beside the option."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Checkbox, Select, Static

from strategies.config import TuneConfig
from tui_fakes import GPU_CAPS, async_test
from tuner_tui.app.widgets.toggles import NOT_USED_MARK, TogglesPanel

# What a worker reports for a CNN (strategies.compose.inapplicable).
CNN = {
    "attention": "no attention module that gputune switches",
    "fused_kernels=gelu": "no tanh-approximated GELU",
    "compile_scope=block": "no repeated blocks: the whole model is compiled",
}


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield TogglesPanel(TuneConfig.from_dict({"fused_kernels": ["gelu"]}), id="toggles")


@async_test
async def test_options_the_model_does_not_use_are_disabled_with_the_reason():
    app = PanelApp()
    async with app.run_test(size=(120, 60)) as pilot:
        panel = app.query_one(TogglesPanel)
        panel.capabilities = GPU_CAPS
        panel.inapplicable = CNN
        await pilot.pause()
        why = app.query_one("#why-attention", Static)
        assert why.display and "no attention module" in str(why.render())
        assert app.query_one("#opt-attention", Select).disabled
        assert app.query_one("#row-attention").has_class("-not-used")
        # A choice: marked in its list; a member of a set: marked, and disabled unless it is set
        # (so that it can be taken back).
        scope = app.query_one("#opt-compile_scope", Select)
        assert any(value == "block" and NOT_USED_MARK in str(prompt) for prompt, value in scope._options)
        gelu = app.query_one("#opt-fused_kernels--gelu", Checkbox)
        assert NOT_USED_MARK in str(gelu.label) and not gelu.disabled
        gelu.value = False
        panel.inapplicable = {}  # a new worker's description arrives
        panel.inapplicable = CNN
        await pilot.pause()
        assert gelu.disabled and not app.query_one("#opt-fused_kernels--layer_norm", Checkbox).disabled
        # Focused, the help line gives the reason too.
        app.query_one("#opt-compile_scope", Select).value = "block"
        app.query_one("#opt-compile_scope", Select).focus()
        await pilot.pause()
        assert "not used by this model: block: no repeated blocks" in str(
            app.query_one("#option-help", Static).render())
        panel.inapplicable = {}
        await pilot.pause()
        assert not app.query_one("#why-attention", Static).display
        assert not app.query_one("#opt-attention", Select).disabled

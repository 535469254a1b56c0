"""The options panel shows what the model does not use, with the reason, beside the option."""

from __future__ import annotations

import contextlib

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


@contextlib.asynccontextmanager
async def panel_on_a_gpu():
    """(app, pilot, the panel) of a running PanelApp, on a GPU's capabilities."""
    app = PanelApp()
    async with app.run_test(size=(120, 60)) as pilot:
        panel = app.query_one(TogglesPanel)
        panel.capabilities = GPU_CAPS
        yield app, pilot, panel


@async_test
async def test_options_the_model_does_not_use_are_disabled_with_the_reason():
    async with panel_on_a_gpu() as (app, pilot, panel):
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


@async_test
async def test_an_option_that_changes_how_the_model_trains_says_so_and_stays_editable():
    async with panel_on_a_gpu() as (app, pilot, panel):
        panel.changes_training = {"micro_batch_size": "its 9 BatchNorm layers would normalize "
                                                      "each micro-batch by its own statistics"}
        await pilot.pause()
        why = app.query_one("#why-micro_batch_size", Static)
        assert why.display and "9 BatchNorm layers" in str(why.render())
        assert not any(w.disabled for w in panel.query("#row-micro_batch_size *"))
        panel.changes_training = {}
        await pilot.pause()
        assert not why.display


@async_test
async def test_the_dashboard_gives_the_panel_what_the_worker_said_of_its_model():
    # (the panel could show both, but nothing gave them to it: every option looked in use)
    from tui_fakes import WORKLOAD, FakeSampler, FakeWorker, wait_for
    from tuner_tui.app.app import GputuneApp

    said = {**WORKLOAD, "inapplicable": CNN,
            "changes_training": {"micro_batch_size": "its 9 BatchNorm layers would ..."}}
    app = GputuneApp(lambda: FakeWorker(workload=said), TuneConfig(),
                     sampler_factory=lambda: FakeSampler(gpu=False))
    async with app.run_test(size=(120, 60)) as pilot:
        await wait_for(pilot, lambda: app.session.capabilities is not None)
        await pilot.pause()
        assert app.toggles.inapplicable == CNN
        assert "9 BatchNorm layers" in app.toggles.changes_training["micro_batch_size"]
        assert app.query_one("#row-attention").has_class("-not-used")

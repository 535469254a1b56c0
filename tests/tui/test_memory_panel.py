"""The memory panel: the current run's peak split into its parts, against the budget."""

from rich.console import Console

from tuner_tui.app.widgets.memory_panel import memory_split, memory_table
from tuner_tui.engine.protocol import TrialResult

GiB = 2**30


def _render(table) -> str:
    console = Console(width=60, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def _result(**kw) -> TrialResult:
    return TrialResult(config={}, label="bf16", status="ok", **kw)


def test_the_peak_splits_into_parameters_gradients_state_and_the_rest():
    result = _result(peak_memory_bytes=10 * GiB,
                     memory_parts={"parameters": 2 * GiB, "gradients": 2 * GiB,
                                   "optimizer_state": 4 * GiB})
    parts = memory_split(result)
    assert parts == {"parameters": 2 * GiB, "gradients": 2 * GiB, "optimizer_state": 4 * GiB,
                     "activations": 2 * GiB}
    text = _render(memory_table(result, budget=8 * GiB, width=20))
    assert "params 2 GiB" in text and "activ+rest 2 GiB" in text
    assert "peak 10 GiB of 8 GiB budget" in text and "over" in text
    fits = _render(memory_table(result, budget=24 * GiB, width=20))
    assert "14 GiB free" in fits


def test_before_the_parts_are_measured_the_panel_says_so():
    assert memory_split(None) is None
    text = _render(memory_table(_result(peak_memory_bytes=GiB), budget=None))
    assert "peak 1 GiB; split after the measured steps" in text

"""The profile panel (key x): asked of the worker, shown beside the leaderboard with the verdict
and what to try. The fake worker answers with a real recorded host-bound CPU profile."""

from __future__ import annotations

import pytest

from recording import load_recording
from screen_text import screen_text
from tui_fakes import (FakeSampler, FakeWorker, RecordedWorker, async_test, host_bound_profile,
                       wait_for, wait_until_still)

from strategies.config import TuneConfig
from tuner_tui.app.app import GputuneApp
from tuner_tui.app.profiling import shown
from tuner_tui.engine import protocol

SIZE = (160, 50)


def make_app(start_config=None):
    workers: list[FakeWorker] = []

    def factory():
        workers.append(FakeWorker())
        return workers[-1]

    return GputuneApp(factory, start_config, sampler_factory=lambda: FakeSampler(gpu=False)), workers


def sent(worker, kind):
    return [c for c in worker.commands if isinstance(c, kind)]


@async_test
async def test_x_profiles_the_current_run_and_the_panel_shows_the_verdict():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        assert not shown(app) and not app.profile_panel.display  # no room taken before a profile
        await pilot.press("x")
        await wait_for(pilot, lambda: bool(app.session.rows[0].result.profile))
        await pilot.pause(0.1)
        (request,) = sent(workers[0], protocol.ProfileRun)
        assert request.trace_path is None
        # In the plots' place: the selected row's configuration stays on screen beside it.
        assert shown(app) and app.profile_panel.display and app.config_view.display
        assert not app.query_one("#plots").display
        text = screen_text(app)
        assert "where the step goes" in text and "run 1: fp32" in text
        assert "host-bound" in text and "of the step is spent outside" in text
        assert "try:" in text and "compile_mode=default" in text
        idle = app.session.rows[0].result.profile["categories"]["idle"]
        assert any("idle" in line and f"{idle:.0%}" in line for line in text.splitlines())
        for name in ("matmul", "norm/elementwise", "optimizer", "memory copies"):
            assert name in text


@async_test
async def test_x_on_another_row_applies_it_again_then_profiles_it_and_X_asks_for_a_trace():
    start = TuneConfig().replace(precision="bf16", attention="sdpa")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        app.leaderboard.focus()
        await pilot.pause()
        await pilot.press("up")  # the baseline row (in run order, the first), not the current run
        await pilot.pause()
        assert app._selected_row().number == 1
        await pilot.press("X")
        await wait_for(pilot, lambda: len(app.session.rows) == 3 and app.session.rows[2].result.profile)
        applied = [c.config for c in sent(workers[0], protocol.ApplyConfig)]
        assert applied[-1]["precision"] == "fp32"  # the chosen row's configuration again
        (request,) = sent(workers[0], protocol.ProfileRun)
        assert request.trace_path.endswith(".json") and "gputune-traces" in request.trace_path
        assert workers[0].commands.index(request) > workers[0].commands.index(
            sent(workers[0], protocol.ApplyConfig)[-1])
        assert app.session.last_profiled().number == 3


def test_the_session_puts_a_profile_on_its_runs_row():
    from tuner_tui.app.session import Session

    session = Session()
    session.apply(protocol.RunStarted(1, TuneConfig(), "fp32", 8), 0.0)
    result = protocol.TrialResult(config={}, label="fp32", status="ok", tokens_per_s=1.0)
    session.apply(protocol.TrialFinished(1, result), 0.0)
    session.apply(protocol.RunStarted(2, TuneConfig(), "bf16", 8), 0.0)
    profile = host_bound_profile({})
    session.apply(protocol.ProfileMeasured(1, profile), 0.0)
    assert session.rows[0].result.profile == profile and session.last_profiled() is session.rows[0]
    assert session.rows[0].result.tokens_per_s == 1.0  # the measured figures stay
    session.apply(protocol.ProfileMeasured(7, profile), 0.0)  # a run with no row: ignored
    assert session.profiled == [1]
    session.apply(protocol.ProfileMeasured(1, {"error": "profile failed: boom"}), 0.0)
    assert ("warning", "profile failed: boom", "worker") in session.logs


class ProfilingRecordedWorker(RecordedWorker):
    """The recorded run, and a profile of its last run when asked."""

    def send(self, command) -> None:
        super().send(command)
        if isinstance(command, protocol.ProfileRun):
            last = [e for e in self.recorded if isinstance(e, protocol.RunStarted)][-1]
            self._emit(protocol.ProfileMeasured(last.run_id, host_bound_profile(last.config.to_dict())))


@pytest.mark.parametrize("size", [(160, 48), (120, 36), (80, 24)])
def test_profile_panel_snapshot(snap_compare, size):
    events = load_recording()
    app = GputuneApp(lambda: ProfilingRecordedWorker(events),
                     sampler_factory=lambda: FakeSampler(gpu=True),
                     subtitle="gpt2-tiny · cpu", clock=lambda: 1000.0)

    async def run_before(pilot):
        await wait_for(pilot, lambda: len(app.session.rows) == 5 and app.gpu_panel.sample is not None)
        await pilot.press("x")
        await wait_for(pilot, lambda: bool(app.session.last_profiled()))
        await pilot.pause(0.3)
        app.refresh_live()
        app.clear_notifications()
        await wait_until_still(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def _gpu_profile_with_matmuls() -> dict:
    """A GPU profile from activities laid out by hand: each step, 300 µs of bf16 gemms launched by
    aten::mm (2·4096³ FLOPs each) and 700 µs of a norm, against the H200's bf16 peak."""
    from tuner_tui.engine.profile import STEP_MARKER, Activity, summarize

    activities = []
    for step in range(3):
        base = step * 1000
        activities.append(Activity(f"{STEP_MARKER}{step}", "annotation", base, base + 1000, 1))
        for i, (op, kernel, start, end, flops) in enumerate((
                ("aten::mm", "nvjet_sm90_tst_256x128", 0, 300, 2 * 4096**3),
                ("aten::native_layer_norm", "layer_norm_kernel", 300, 1000, 0.0))):
            op_id = 10 * step + i + 1
            activities += [
                Activity(op, "op", base + i, base + i + 0.5, 1, id=op_id, flops=flops,
                         dtype="c10::BFloat16"),
                Activity(kernel, "kernel", base + start, base + end, 7, link=op_id)]
    return summarize(activities, "cuda", peaks={"bf16": (989.4, "datasheet")},
                     config={"precision": "bf16"})


@async_test
async def test_the_panel_shows_the_matmul_rate_against_its_peak_in_one_line():
    from textual.app import App

    from tuner_tui.app.widgets.profile_panel import ProfilePanel

    profile = _gpu_profile_with_matmuls()

    class PanelApp(App):
        def compose(self):
            yield ProfilePanel()

    app = PanelApp()
    async with app.run_test(size=(120, 30)) as pilot:
        app.query_one(ProfilePanel).show(2, "bf16", profile)
        await pilot.pause()
        lines = [line.strip() for line in screen_text(app).splitlines() if "TFLOP/s" in line]
    assert lines == ["matmul: 458.1 TFLOP/s bf16 = 46% of peak"]


def test_the_profilers_own_memory_is_said_apart_from_the_rows_peak():
    from tuner_tui.app.widgets.profile_panel import facts

    profile = dict(host_bound_profile({}), profiler_memory_bytes=70 << 20)
    assert "the profiler's own memory: 70 MiB, not in the row's peak" in facts(profile).plain
    assert "profiler's own" not in facts(host_bound_profile({})).plain

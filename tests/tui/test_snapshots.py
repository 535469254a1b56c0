"""Snapshots of the dashboard with the events of a recorded CPU run (tests/tui/data).

Update the SVG baselines after an intended change with `pytest tests/tui --snapshot-update`
and look at them before committing.
"""

from __future__ import annotations

from recording import load_recording
from tui_fakes import FakeSampler, RecordedWorker, wait_for, wait_until_still

from strategies.config import TuneConfig
from tuner_tui.app.app import GputuneApp
from tuner_tui.engine import protocol

RUNS = 5


def recorded_app(gpu: bool = True, gpus: int = 1) -> GputuneApp:
    events = load_recording()
    return GputuneApp(
        lambda: RecordedWorker(events),
        sampler_factory=lambda: FakeSampler(gpu=gpu, count=gpus),
        subtitle="gpt2-tiny · cpu",
        clock=lambda: 1000.0,
    )


async def settle(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: len(app.session.rows) == RUNS and app.gpu_panel.sample is not None)
    await pilot.pause(0.3)
    app.refresh_live()
    app.clear_notifications()
    await wait_until_still(pilot)


def test_main_screen(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(160, 48), run_before=settle)


def test_main_screen_120x36_without_gpu(snap_compare):
    assert snap_compare(recorded_app(gpu=False), terminal_size=(120, 36), run_before=settle)


def test_leaderboard_sorted_with_a_row_chosen(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        pilot.app.leaderboard.focus()
        await pilot.pause()
        await pilot.press("s", "up")
        await pilot.pause(0.1)
        pilot.app.clear_notifications()
        await wait_until_still(pilot)

    assert snap_compare(recorded_app(), terminal_size=(160, 50), run_before=run_before)


def test_export_dialog(snap_compare, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no gputune.toml there: the dialog's note does not vary

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("e")
        await pilot.pause(0.2)
        pilot.app.screen.query_one("Input").cursor_blink = False
        await wait_until_still(pilot)

    assert snap_compare(recorded_app(), terminal_size=(160, 50), run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await wait_until_still(pilot)

    assert snap_compare(recorded_app(), terminal_size=(160, 50), run_before=run_before)


def test_compiling_indicator(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        app = pilot.app
        worker = app.reader._source
        # A compile in flight for 7 s on the app's fixed clock.
        worker._emit(protocol.RunStarted(6, TuneConfig.from_dict(app.session.run_config), "fp32 + compile(max-autotune)", 8))
        worker._emit(protocol.CompileStarted(6))
        await wait_for(pilot, lambda: app.session.worker_state == "compiling")
        app.session.compile_started_at = 993.0
        app.refresh_live()
        app.clear_notifications()
        await wait_until_still(pilot)

    assert snap_compare(recorded_app(), terminal_size=(160, 50), run_before=run_before)


def test_main_screen_80x24(snap_compare):
    assert snap_compare(recorded_app(gpu=False), terminal_size=(80, 24), run_before=settle)


def test_main_screen_four_gpus(snap_compare):
    assert snap_compare(recorded_app(gpus=4), terminal_size=(160, 50), run_before=settle)

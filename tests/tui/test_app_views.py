"""What the screen holds at 80x24, the log view, the one-time builds, and the dashboard's own rows
in the history."""

from __future__ import annotations

from screen_text import screen_text
from strategies.config import TuneConfig
from tui_fakes import FakeSampler, FakeWorker, async_test, wait_for
from tuner_tui.app.app import GputuneApp
from tuner_tui.app.screens.history import HistoryScreen
from tuner_tui.app.screens.log import LogScreen
from tuner_tui.engine import protocol


def make_app(**kw):
    workers: list[FakeWorker] = []

    def factory():
        workers.append(FakeWorker())
        return workers[-1]

    app = GputuneApp(factory, TuneConfig().replace(precision="bf16"),
                     sampler_factory=lambda: FakeSampler(gpu=False), **kw)
    return app, workers


@async_test
async def test_at_80x24_the_figures_the_status_column_and_after_x_the_verdict_are_on_screen():
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        # the screen redraws on its own timer: wait for the figures, not a fixed time
        await wait_for(pilot, lambda: "tokens/s 21k" in screen_text(app))
        assert app.layout_mode == "compact" and app.view == "plots"
        text = screen_text(app)
        assert "tokens/s 21k" in text and "×2.10 baseline" in text  # the row's figures
        assert "status" in text and " ok " in text and "vs base" in text
        assert "╭─ tokens/s  " in text and "╭─ step ms  " in text  # the plots beside them
        await pilot.press("v")
        assert app.view == "system" and "NVML not available" in screen_text(app)
        await pilot.press("v")
        assert app.view == "options" and "Precision" in screen_text(app)
        await pilot.press("x")
        await wait_for(pilot, lambda: bool(app.session.current_result().profile))
        await wait_for(pilot, lambda: "host-bound" in screen_text(app))
        text = screen_text(app)
        assert app.view == "profile" and "host-bound" in text and "try:" in text
        assert "status" in text and "tokens/s 21k" in text
        await pilot.press("x")  # again on the row shown: back to the view before
        assert app.view == "options"


@async_test
async def test_library_warnings_go_to_the_log_view_not_over_the_screen():
    app, workers = make_app(log_path="/tmp/gputune-runs/x/worker.log")
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        workers[0]._emit(
            protocol.WorkerLog("warning", "Failed to load /x/torchao/_C_mxfp8.so", "torchao"),
            protocol.WorkerLog("warning", "the fp32 reference does not fit: unchecked"))
        await wait_for(pilot, lambda: app.session.warnings_logged() == 2)
        app.refresh_live()
        await pilot.pause(0.1)
        messages = [n.message for n in app._notifications]
        assert not any("Failed to load" in m for m in messages)  # a library's: the log only
        assert any("does not fit" in m for m in messages)  # the worker's own: said at once
        assert "⚠ 2 in log (l)" in screen_text(app)
        app.clear_notifications()
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen))
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "torchao: Failed to load" in text and "/tmp/gputune-runs/x/worker.log" in text
        assert "Esc closes" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, LogScreen))


@async_test
async def test_a_one_time_build_is_shown_as_building_with_its_seconds():
    now = [100.0]
    app, workers = make_app(clock=lambda: now[0])
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        config = TuneConfig().replace(weights="bf16", precision="bf16")
        workers[0]._emit(protocol.RunStarted(9, config, config.label(), 8))
        await wait_for(pilot, lambda: app.session.run_id == 9)
        now[0] += 3.0
        app.refresh_live()
        await pilot.pause()
        assert "first step… 3s" in screen_text(app)
        workers[0]._emit(protocol.CompileStarted(9, "torchao's compiled optimizer step"))
        await wait_for(pilot, lambda: app.session.worker_state == "compiling")
        now[0] += 61.0
        app.refresh_live()
        await pilot.pause()
        assert "building torchao's compiled optimizer step… 61s" in screen_text(app)


@async_test
async def test_the_dashboards_rows_are_in_the_store_and_the_history(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    app, _ = make_app(record=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        await pilot.pause(0.5)  # the store's thread
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        assert {t.source for t in app.screen.trials} == {"dashboard"}
        assert {t.result.label for t in app.screen.trials} == {"fp32", "bf16"}
        assert "dashboard" in screen_text(app) and "`" not in screen_text(app)

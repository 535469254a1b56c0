"""The dashboard on the real worker process (gpt2-tiny on the CPU): a toggle reaches the worker,
rows carry measured figures, export loads, a killed worker is replaced, quit leaves nothing."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from textual.widgets import Input, Select

import strategies
from strategies.config import TuneConfig
from tui_fakes import async_test, wait_for
from tuner_tui.app.app import GputuneApp
from tuner_tui.app.screens.export import ExportScreen
from tuner_tui.engine.client import WorkerClient
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.telemetry import TelemetrySampler

SPEC = WorkerSpec(workload="gpt2-tiny", device="cpu")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@async_test
async def test_dashboard_drives_the_real_worker(tmp_path):
    app = GputuneApp(lambda: WorkerClient(SPEC), sampler_factory=TelemetrySampler, measure_steps=8)
    pids: set[int] = set()
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1, timeout=120)
        base = app.session.rows[0].result
        assert base.status == "ok" and base.tokens_per_s > 0 and base.step_ms > 0
        assert app.host_panel.sample is not None and app.host_panel.sample.process is not None
        pids.add(app.session.worker_pid)

        # A toggle reaches the worker: the run it reports carries the option.
        app.query_one("#opt-optimizer", Select).value = "foreach"
        await pilot.press("a")
        await wait_for(pilot, lambda: len(app.session.rows) == 2, timeout=120)
        tuned = app.session.rows[1].result
        assert tuned.config["optimizer"] == "foreach" and tuned.label == "fp32 + foreach AdamW"
        assert tuned.status == "ok" and tuned.tokens_per_s > 0
        assert app.session.change_vs_baseline(app.session.rows[1]) > 0

        # Export: no row chosen, so the best (or the simpler of a tie), which the dialog names.
        pick = app.leaderboard.standings.pick
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        assert f"run {pick.number}: {pick.result.label}" in app.screen.what
        app.screen.query_one("#export-path", Input).value = str(tmp_path / "gputune.toml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (tmp_path / "gputune.toml").exists())
        assert strategies.load(tmp_path / "gputune.toml") == pick.result.tune_config

        # SIGKILL the worker: noticed within 2 s, replaced, rows kept, last config re-applied.
        old = app.session.worker_pid
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        await wait_for(pilot, lambda: app.session.worker_pid != old, timeout=5)
        assert time.monotonic() - killed < 2.0
        await wait_for(pilot, lambda: len(app.session.rows) == 3, timeout=120)
        assert [r.result.status for r in app.session.rows[:2]] == ["ok", "ok"]
        assert app.session.rows[2].result.config["optimizer"] == "foreach"
        pids.add(app.session.worker_pid)
        await pilot.press("q")
        await wait_for(pilot, lambda: all(gone(p) for p in pids), timeout=15)
    assert all(gone(p) for p in pids)


@pytest.mark.slow
@async_test
async def test_an_oom_in_the_worker_becomes_an_oom_row_and_the_worker_lives_on():
    spec = WorkerSpec(workload="gpt2-tiny", device="cpu", fault_injection="oom")
    app = GputuneApp(lambda: WorkerClient(spec), sampler_factory=None, measure_steps=8)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1, timeout=120)
        row = app.session.rows[0]
        assert row.result.status == "oom"
        assert "out of memory" in row.result.message.lower()
        assert app.session.worker_state == "idle" and app.reader._source.is_alive()
        assert any("oom" in (n.title or "") for n in app._notifications)
        pid = app.session.worker_pid
        await pilot.press("q")
        await wait_for(pilot, lambda: gone(pid), timeout=15)

"""The dashboard when its worker fails: a failed run, a dead worker restarted, a configuration
that keeps killing it, a worker that cannot start or load its workload, and the event reader
that carries a death to the UI in order. Against an in-process fake worker."""

from __future__ import annotations

from strategies.config import TuneConfig
from textual.widgets import Select

from tui_fakes import GPU_CAPS, FakeWorker, applied, async_test, make_app, wait_for
from tuner_tui.app.app import GputuneApp
from tuner_tui.app.reader import EventReader, EventsReady
from tuner_tui.engine import protocol

SIZE = (160, 50)


@async_test
async def test_failed_run_gets_its_status_row_and_the_worker_goes_on():
    app, workers = make_app(caps=GPU_CAPS, fail={"fp16": "diverged"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        app.query_one("#opt-precision", Select).value = "fp16"
        await pilot.press("a")
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        assert app.session.rows[-1].result.status == "diverged"
        assert app.session.worker_state == "idle"
        assert app.session.change_vs_baseline(app.session.rows[-1]) is None
        app.query_one("#opt-precision", Select).value = "bf16"
        await pilot.press("a")
        await wait_for(pilot, lambda: len(app.session.rows) == 3)
        assert app.session.rows[-1].result.status == "ok"


@async_test
async def test_dead_worker_is_noticed_restarted_and_the_last_config_reapplied():
    start = TuneConfig().replace(precision="bf16")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        # A new run that dies before it is measured:
        workers[0]._emit(protocol.RunStarted(99, start.replace(attention="sdpa"), "bf16 + sdpa", 8))
        await wait_for(pilot, lambda: app.session.run_id == 99)
        app.last_requested = start.replace(attention="sdpa")
        workers[0].kill()
        await wait_for(pilot, lambda: len(workers) == 2, timeout=2.0)
        await wait_for(pilot, lambda: len(app.session.rows) == 4)
        statuses = [r.result.status for r in app.session.rows]
        assert statuses == ["ok", "ok", "crash", "ok"]
        assert "SIGKILL" in app.session.rows[2].result.message
        assert applied(workers[1])[0]["attention"] == "sdpa"
        assert app.leaderboard.row_count == 4


@async_test
async def test_a_config_that_keeps_killing_the_worker_falls_back_to_the_baseline():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        bad = TuneConfig().replace(optimizer="fused")
        for n in (1, 2):
            app.last_requested = bad
            workers[-1].kill()
            await wait_for(pilot, lambda: len(workers) == n + 1, timeout=3.0)
            await wait_for(pilot, lambda: app.session.worker_state != "dead")
            await wait_for(pilot, lambda: applied(workers[-1]))
        assert applied(workers[1])[0]["optimizer"] == "fused"
        assert applied(workers[2])[0]["optimizer"] == "plain"


@async_test
async def test_worker_that_cannot_start_is_reported_without_restart_storm():
    class Broken(FakeWorker):
        def start(self):
            self.alive = True
            self._emit(protocol.RunFailed(0, "invalid", "unknown workload 'nope': allowed workloads are gpt2-tiny"))
            self.alive, self.code = False, 1

    made = []
    app = GputuneApp(lambda: made.append(Broken()) or made[-1], sampler_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any("unknown workload" in n.message for n in app._notifications))
        await pilot.pause(1.0)
        assert len(made) == 1
        assert app.session.worker_state == "dead"


def test_reader_close_stops_the_source_and_is_idempotent():
    posted = []
    worker = FakeWorker()
    reader = EventReader(lambda: worker, posted.append)
    reader.start()
    import time

    deadline = time.monotonic() + 2
    while not worker.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    reader.close()
    reader.close()
    assert not reader.is_alive() and not worker.alive


def test_a_death_reaches_the_ui_after_the_dead_workers_events_and_before_the_next_ones():
    """The UI counts a death against the configuration in flight: it must see the death
    before the next worker's WorkerReady, or the next worker is sent the same configuration."""
    import time

    from tuner_tui.app.reader import WorkerExited, WorkerStarted

    made: list[FakeWorker] = []
    reader = EventReader(lambda: made.append(FakeWorker()) or made[-1], lambda message: None)
    reader.start()
    try:
        deadline = time.monotonic() + 5
        while not made or not made[0].alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        made[0].send(protocol.ApplyConfig(TuneConfig(), measure_steps=4))
        made[0].kill()
        while len(made) < 2 or not made[1].alive:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        kinds = [type(e).__name__ for e in reader.take()]
    finally:
        reader.close()
    assert kinds[0] == "WorkerStarted" and "TrialFinished" in kinds
    finished, exited = kinds.index("TrialFinished"), kinds.index(WorkerExited.__name__)
    assert finished < exited < kinds.index(WorkerStarted.__name__, 1) < len(kinds) - 1
    assert kinds[-1] == "WorkerReady" and kinds.count("WorkerReady") == 2


def test_children_of_a_killed_worker_are_reaped():
    """A SIGKILLed worker's children (torch.compile's compile workers) are orphaned, not killed;
    the reader remembers them while the worker lives and reaps them when it dies."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    parent_code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )

    class ProcessWorker(FakeWorker):
        def start(self):
            self.proc = subprocess.Popen([sys.executable, "-c", parent_code])
            self._pid = self.proc.pid
            super().start()

        def is_alive(self):
            return self.proc.poll() is None

        def exitcode(self):
            return self.proc.poll()

        def stop(self, timeout=5.0):
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    made: list[ProcessWorker] = []
    reader = EventReader(lambda: made.append(ProcessWorker()) or made[-1], lambda message: None)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if made and hasattr(made[0], "proc") and psutil.Process(made[0].pid).children():
                break
            time.sleep(0.05)
        child = psutil.Process(made[0].pid).children()[0]
        time.sleep(1.5)  # the reader lists children once a second
        os.kill(made[0].pid, signal.SIGKILL)
        child.wait(timeout=10)  # raises if the orphan survives
        deadline = time.monotonic() + 10
        while len(made) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(made) == 2  # and a new worker took its place
    finally:
        reader.close()
    for worker in made:
        assert not psutil.pid_exists(worker.pid) or psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE


@async_test
async def test_a_workload_that_fails_to_load_keeps_its_error_in_the_status_line():
    from tuner_tui.app.widgets.run_status import status_text

    class Broken(FakeWorker):
        def start(self):
            self.alive = True
            self._emit(protocol.RunFailed(0, "invalid", "workload 'mine:build' raised KeyError: 'x'"))
            self.alive, self.code = False, 1

    app = GputuneApp(lambda: Broken(), sampler_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session.worker_state == "dead")
        app.clear_notifications()
        await pilot.pause(0.5)
        line = status_text(app.session, 0.0).plain
        assert "workload 'mine:build' raised KeyError" in line, line
        assert "worker died" in line


@async_test
async def test_an_event_that_arrives_while_the_app_shuts_down_is_kept_without_touching_the_screen():
    # The worker's last events can be dispatched after Textual has removed the widgets (CI
    # once saw a search's last RunStarted reach the options panel when its rows were gone).
    app, workers = make_app(caps=GPU_CAPS)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
    config = TuneConfig().replace(precision="fp16")
    app.reader._deliver(protocol.RunStarted(run_id=99, config=config, label="fp16", batch_size=8))
    app.on_events_ready(EventsReady())
    assert app.session.run_id == 99 and app.session.run_config == config.to_dict()

"""The dashboard's state machine without Textual: a `Controller` and a `Session` wired to the
in-process fake worker, the screen replaced by a recording stand-in."""

from __future__ import annotations

import sys

import pytest

import strategies
from strategies.config import TuneConfig
from tuner_tui.app.controller import CRASHES_BEFORE_BASELINE, Controller
from tuner_tui.app.session import Session
from tuner_tui.engine import protocol

from tui_fakes import GPU_CAPS, FakeWorker


class Screen:
    """The `Controls` the app gives the controller, recorded."""

    def __init__(self) -> None:
        self.worker: FakeWorker | None = None
        self.notes: list[tuple[str, str, str]] = []
        self.shown: list[TuneConfig] = []
        self.ranked = False

    def send(self, command) -> bool:
        if self.worker is None or not self.worker.alive:
            return False
        self.worker.send(command)
        return True

    def notify(self, message, *, title="", severity="information", timeout=None) -> None:
        self.notes.append((severity, title, message))

    def show_config(self, config: TuneConfig) -> None:
        self.shown.append(config)

    def show_search_result(self) -> None:
        self.ranked = True


class Harness:
    """What the app's reader thread and message handlers do, done by hand."""

    def __init__(self, start_config=None, **fake) -> None:
        self.fake = fake
        self.session = Session()
        self.screen = Screen()
        self.controller = Controller(self.session, self.screen, start_config, measure_steps=5)
        self.workers: list[FakeWorker] = []

    def start_worker(self) -> FakeWorker:
        worker = FakeWorker(**self.fake)
        self.workers.append(worker)
        self.screen.worker = worker
        self.session.worker_started(worker.pid)
        worker.start()
        self.pump()
        return worker

    def pump(self) -> None:
        worker = self.screen.worker
        while (event := worker.wait_event(0)) is not None:
            self.session.apply(event, 0.0)
            self.controller.on_event(event)

    def crash(self) -> None:
        worker = self.screen.worker
        worker.kill()
        self.controller.worker_exited(worker.exitcode(), worker.pid, "", restarting=True)

    def sent(self, worker: FakeWorker | None = None) -> list[dict]:
        worker = worker or self.screen.worker
        return [c.config.to_dict() for c in worker.commands if isinstance(c, protocol.ApplyConfig)]

    @property
    def labels(self) -> list[str]:
        return [r.result.label for r in self.session.rows]


def test_the_baseline_runs_first_then_the_start_configuration():
    start = TuneConfig().replace(precision="bf16")
    h = Harness(start)
    h.start_worker()
    assert h.labels == ["fp32", "bf16"]
    assert h.workers[0].commands[0].measure_steps == 5
    assert h.controller.queue == []


def test_configurations_in_turn_run_each_after_the_previous_one():
    h = Harness()
    h.start_worker()
    h.controller.apply_in_turn([TuneConfig().replace(precision="bf16"), TuneConfig().replace(attention="sdpa")])
    h.pump()
    assert h.labels == ["fp32", "bf16", "fp32 + sdpa"]


def test_a_failed_run_moves_the_queue_on():
    h = Harness(caps=GPU_CAPS, fail={"fp16": "diverged"})
    h.start_worker()
    h.controller.apply_in_turn([TuneConfig().replace(precision="fp16"), TuneConfig().replace(precision="bf16")])
    h.pump()
    assert [r.result.status for r in h.session.rows] == ["ok", "diverged", "ok"]
    assert any(title == "run failed: diverged" for _, title, _ in h.screen.notes)


def test_a_configuration_this_machine_cannot_run_is_refused_before_anything_is_sent():
    h = Harness()  # CPU capabilities
    h.start_worker()
    assert h.controller.apply(TuneConfig().replace(precision="fp16")) is False
    assert len(h.sent()) == 1
    assert h.screen.notes[-1][:2] == ("error", "cannot apply") and "fp16" in h.screen.notes[-1][2]


def test_asked_for_while_no_worker_is_up_it_is_sent_once_one_is_ready():
    h = Harness()
    h.start_worker()
    h.crash()
    wanted = TuneConfig().replace(attention="sdpa")
    assert h.controller.apply(wanted) is True
    assert h.controller.deferred == wanted
    worker = h.start_worker()
    assert h.sent(worker) == [wanted.to_dict()] and h.controller.deferred is None


def test_after_a_crash_the_last_configuration_runs_again_until_it_has_crashed_twice():
    h = Harness()
    h.start_worker()
    bad = TuneConfig().replace(optimizer="fused")
    h.controller.apply(bad)
    h.pump()
    for n in range(1, CRASHES_BEFORE_BASELINE + 1):
        h.crash()
        assert h.controller.crashes[bad] == n
        worker = h.start_worker()
        expected = bad if n < CRASHES_BEFORE_BASELINE else TuneConfig()
        assert h.sent(worker)[0] == expected.to_dict()
    assert any("killed the worker 2 times" in text for _, _, text in h.screen.notes)


def test_a_restart_the_user_asked_for_is_not_a_crash():
    h = Harness()
    h.start_worker()
    h.controller.worker_exited(0, h.screen.worker.pid, "restart requested", restarting=True)
    assert h.controller.crashes == {}
    assert [r.result.status for r in h.session.rows] == ["ok"]
    worker = h.start_worker()
    assert h.sent(worker) == [TuneConfig().to_dict()]


def test_a_crash_mid_run_gets_its_row_and_a_notification():
    h = Harness()
    h.start_worker()
    h.screen.worker._emit(protocol.RunStarted(99, TuneConfig(), "fp32", 8))
    h.pump()
    h.crash()
    assert h.session.rows[-1].result.status == "crash"
    assert h.screen.notes[-1][:2] == ("error", "worker died")
    assert h.screen.notes[-1][2].endswith("; starting a new worker")


def test_the_search_walks_the_space_applies_the_best_and_stops_on_a_choice_by_hand():
    h = Harness(caps=GPU_CAPS, steps=3)
    h.start_worker()
    h.controller.toggle_search()
    h.pump()
    assert h.controller.search is None  # the fake worker answers at once: the search ran to its end
    searched = h.labels[:-1]
    assert len(searched) >= 3 and len(searched) == len(set(searched))
    fastest = max(r.result.tokens_per_s for r in h.session.rows)
    best = next(r for r in h.session.rows if r.result.config == h.sent()[-1])
    assert best.result.tokens_per_s == fastest and h.screen.ranked  # the simpler of a tie
    assert h.screen.shown[-1] == TuneConfig.from_dict(best.result.config)
    assert h.session.search_note == ""

    h = Harness(caps=GPU_CAPS, steps=3)  # a search under way, then a choice by hand
    h.start_worker()
    h.controller.queue.append(TuneConfig())
    h.controller.toggle_search()
    assert h.controller.search is not None and h.controller.queue == []
    h.controller.apply_instead(TuneConfig(), "baseline applied")
    assert h.controller.search is None
    assert h.screen.notes[-1][2].startswith("search stopped: baseline applied")


def test_export_takes_the_chosen_row_else_the_best_and_says_which(tmp_path):
    h = Harness()
    what, exported = h.controller.export_target(None, TuneConfig())
    assert what.startswith("current configuration: fp32") and "no row" in what  # nothing ran
    start = TuneConfig().replace(precision="bf16")
    h = Harness(start)
    h.start_worker()
    what, exported = h.controller.export_target(None, TuneConfig())
    assert what.startswith("run 2: bf16 (ok): best: #2 bf16") and exported.config == start
    assert "ahead of #1, beyond the" in what and exported.measured["verdict"] in what
    assert exported.measured["tokens_per_s"] > 0 and exported.workload == "gpt2-tiny"
    what, exported = h.controller.export_target(h.session.rows[0], TuneConfig())
    assert what == "run 1: fp32 (ok): the selected row" and exported.config == TuneConfig()
    h.controller.write_export(exported, str(tmp_path / "base.json"), None)
    assert strategies.load(tmp_path / "base.json") == TuneConfig()
    assert h.screen.notes[-1][1] == "exported"
    h.controller.write_export(exported, str(tmp_path / "missing" / "x.toml"), None)
    assert h.screen.notes[-1][:2] == ("error", "export failed")


def test_a_past_configuration_is_reapplied_and_a_bad_one_explained():
    h = Harness()
    h.start_worker()
    h.controller.reapply_past(None)
    h.controller.reapply_past({"precision": "fp99"})
    assert h.screen.notes[-1][1] == "cannot re-apply" and "fp99" in h.screen.notes[-1][2]
    h.controller.reapply_past(TuneConfig().replace(attention="sdpa").to_dict())
    h.pump()
    assert h.labels == ["fp32", "fp32 + sdpa"]
    h.controller.reapply_row(h.session.rows[0])
    h.pump()
    assert h.labels[-1] == "fp32"


@pytest.mark.skipif(sys.platform != "linux", reason="subprocess check")
def test_the_controller_imports_without_textual():
    import subprocess

    code = "import sys, tuner_tui.app.controller; assert 'textual' not in sys.modules, 'textual'; " \
           "assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)

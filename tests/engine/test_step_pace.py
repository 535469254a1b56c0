"""A trial past its timeout runs on while its steps still come and those left fit its limit
(`step_pace.py`, `runner.run_one`); one whose steps stopped is stopped as hung."""

from __future__ import annotations

import io
import queue
import threading
import time

import pytest

from strategies.config import TuneConfig
from tuner_tui.engine import protocol, step_pace
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.runner import TrialPlan, gave_no_result, run_one, stopped_while_stepping
from tuner_tui.engine.search.deadline import Deadline
from tuner_tui.engine.step_pace import StepPace


def paced(times: list[float], total: int, quiet_s: float = 60.0) -> StepPace:
    pace = StepPace(total, quiet_s)
    for t in times:
        pace.step(t)
    return pace


def test_a_steady_trial_is_given_room_for_its_steps_left_up_to_its_limit():
    pace = paced([40.0, 50.0, 60.0, 70.0], total=10)  # 10 s a step, 6 steps left
    assert pace.seconds_a_step() == 10.0 and pace.steps_left() == 6
    assert pace.extended(now=72.0, limit=900.0) == pytest.approx(72.0 + 1.5 * 60 + 30)
    assert pace.extended(now=72.0, limit=140.0) == 140.0  # never past the limit
    assert pace.extended(now=72.0, limit=120.0) is None  # 60 s more do not fit in 48
    done = paced([10.0 * i for i in range(1, 11)], total=10)  # all ended: its result comes next
    assert done.extended(now=101.0, limit=900.0) == 131.0
    assert done.extended(now=101.0, limit=101.0) is None  # (at the limit: stopped, no loop)


def test_before_its_steps_show_a_pace_a_trial_lives_while_signs_come_within_its_timeout():
    assert paced([], 10).extended(100.0, 900.0) is None  # nothing came: hung
    # A first forward and backward 40 s and 70 s in (a first step slower than its 60-s timeout)
    pace = paced([], 10, quiet_s=60.0)
    pace.part(40.0)
    assert pace.is_stepping(60.0) and pace.extended(60.0, 900.0) == 100.0
    pace.part(70.0)
    assert pace.extended(100.0, 900.0) == 130.0 and pace.extended(100.0, 110.0) == 110.0
    assert pace.extended(130.0, 900.0) is None  # silent for its whole timeout: hung
    assert pace.describe(100.0) == ("it was still stepping: 0 of 10 steps ended, 2 micro-batch "
                                    "parts done, the last 30 s before")
    pace.step(95.0)  # its first step ended: still no pace, the last sign counts
    assert pace.extended(130.0, 900.0) == 155.0


def test_no_room_once_the_steps_stopped():
    pace = paced([40.0, 50.0, 60.0], total=10)
    assert pace.is_stepping(60.0 + 3 * 10 + 30)
    assert not pace.is_stepping(60.0 + 3 * 10 + 31)  # quiet for longer than 3 steps and 30 s
    assert pace.extended(60.0 + 3 * 10 + 31, 900.0) is None
    assert pace.describe(60.0) == ("it was still stepping: 3 of 10 steps, 10.0 s a step, "
                               "70 s more needed")


class ScriptedClient:
    """A worker's side of one trial, in real time: a step every `every` seconds after a first
    one at `first` (and `parts` of it before), `steps` of them, then its result (or nothing
    more: a hang)."""

    def __init__(self, steps: int, every: float, first: float = 0.05, finishes: bool = True,
                 parts: int = 0):
        self.events: queue.Queue = queue.Queue()
        self.sent: list = []
        self._args = (steps, every, first, finishes, parts)

    def send(self, command) -> None:
        self.sent.append(command)
        threading.Thread(target=self._play, daemon=True).start()

    def _play(self) -> None:
        steps, every, first, finishes, parts = self._args
        for _ in range(parts):  # the first step's forwards and backwards, evenly spread
            time.sleep(first / (parts + 1))
            self.events.put(protocol.StepPart(1, 0, "forward"))
        time.sleep(first / (parts + 1))
        for step in range(steps):
            if step:
                time.sleep(every)
            self.events.put(protocol.StepMeasured(1, step, every * 1e3, 1.0, 1.0, None, 0, 0,
                                                  time.time()))
        if finishes:
            self.events.put(protocol.TrialFinished(1, protocol.TrialResult(
                config={}, label="fp32", status="ok", tokens_per_s=1.0)))

    def wait_event(self, timeout: float):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def is_alive(self) -> bool:
        return True

    def exitcode(self):
        return None


def trial(client, timeout_s: float, limit_s: float | None) -> protocol.TrialResult:
    plan = TrialPlan(steps=8, warmup_steps=2, trial_timeout_s=timeout_s, limit_s=limit_s)
    return run_one(client, TuneConfig(), plan, (), Progress(io.StringIO()))


@pytest.fixture
def short_quiet(monkeypatch):
    monkeypatch.setattr(step_pace, "QUIET_S", 0.3)  # (seconds here, not the tens of a real trial)


def test_a_trial_slower_than_planned_runs_on_to_its_result_within_its_limit(short_quiet):
    # 10 steps 0.1 s apart: about 1 s, where 0.6 s were planned
    started = time.monotonic()
    result = trial(ScriptedClient(steps=10, every=0.1), timeout_s=0.6, limit_s=10.0)
    assert result.status == "ok" and time.monotonic() - started < 5.0
    # Without a limit past its timeout (bench, a leader's repeat), stopped as before, saying how
    # far it got
    stopped = trial(ScriptedClient(steps=10, every=0.1), timeout_s=0.6, limit_s=None)
    assert gave_no_result(stopped) and stopped_while_stepping(stopped), stopped.message
    assert stopped.message.startswith("no result within 1 s; the worker was stopped (it was "
                                      "still stepping: ")


def test_a_first_step_longer_than_the_timeout_runs_on_while_its_parts_come(short_quiet):
    # A first step of 2 s, where the trial was given 0.8 s: its forwards and backwards show it
    # works
    result = trial(ScriptedClient(steps=10, every=0.02, first=2.0, parts=9), timeout_s=0.8,
                   limit_s=10.0)
    assert result.status == "ok", result.message
    silent = trial(ScriptedClient(steps=10, every=0.02, first=2.0), timeout_s=0.8, limit_s=10.0)
    assert gave_no_result(silent) and not stopped_while_stepping(silent), silent.message


def test_a_trial_whose_steps_stopped_is_stopped_as_hung(short_quiet):
    started = time.monotonic()
    result = trial(ScriptedClient(steps=3, every=0.1, finishes=False), timeout_s=0.5, limit_s=60.0)
    assert gave_no_result(result) and not stopped_while_stepping(result), result.message
    assert time.monotonic() - started < 5.0  # not held to its limit


def test_the_limits_of_a_trial_and_the_blame_of_one_stopped_while_stepping():
    clock = [0.0]
    budgeted = Deadline(300.0, 900.0, lambda: clock[0])
    clock[0] = 200.0
    # the budget's end, plus the trial's time, at most a tenth of the budget
    assert budgeted.limit(50.0) == pytest.approx(100.0 + 30.0)
    assert budgeted.limit(50.0, by_budget_end=True) == pytest.approx(110.0)
    assert budgeted.timeout(50.0) == min(budgeted.hang_s(50.0), budgeted.limit(50.0))
    slow = protocol.TrialResult(
        config={}, label="fp32", status="crash",
        message="no result within 150 s; the worker was stopped (it was still stepping: 12 of "
                "25 steps, 8.0 s a step, 104 s more needed; its limit was 150 s)")
    cut = budgeted.cut_short(slow, 150.0, 40.0, limit=150.0)
    assert cut.status == "timeout" and cut.message.startswith("stopped at the time budget's end")
    # Stopped at the user's --trial-timeout: a crash row that says it was still stepping
    unbudgeted = Deadline(None, 900.0, lambda: clock[0])
    assert unbudgeted.limit(50.0) == 900.0
    # Before any step of the model was measured, its expected time is a guess: without a time
    # budget the trial is given --trial-timeout; within one, the budget rules as before
    assert unbudgeted.timeout(17.0) == 81.0 and unbudgeted.timeout(17.0, guessed=True) == 900.0
    assert budgeted.timeout(50.0, guessed=True) == budgeted.timeout(50.0)
    assert unbudgeted.cut_short(slow, 150.0, 40.0, limit=900.0) is slow

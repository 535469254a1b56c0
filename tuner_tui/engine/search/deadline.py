"""The time budget of one search: how long it has run and has left, and when a trial is
stopped (hung, or run past the budget's end). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.runner import gave_no_result, stopped_while_stepping

TIMEOUT_FLOOR_S = 60.0
"""The least a trial is given before it counts as hung, whatever its estimate."""
GRACE_S = 10.0
"""How far past the time budget a run let in on a plan, not a promise (a leader's repeat, a
move let in on a compile from the cache) may go before it is stopped. On the H200 a repeat of
the HF Llama with float8 and CUDA graphs, planned with a compile from the cache, compiled as
long as cold (103 s for 50 planned), and the two leaders' repeats ended 37 s past five minutes."""
OVERRUN_SHARE = 0.1
"""A trial planned to end within the time budget is stopped this share of the budget past its
end (at least GRACE_S), where its own expected time would let it run longer: a hung compile
planned at 157 s had run as long past a five-minute budget. In 1000
simulated searches at five minutes, the 35 that ended more than 30 s late were all ended by a
hung or far too slow trial that gave nothing."""


class Deadline:
    """From now, with `budget_s` seconds (None or 0: no limit) and trials given at most
    `trial_timeout_s` each."""

    def __init__(self, budget_s: float | None, trial_timeout_s: float,
                 clock: Callable[[], float]) -> None:
        self.budget_s = budget_s
        self.trial_timeout_s = trial_timeout_s
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def time_left(self) -> float:
        if not self.budget_s:
            return math.inf
        return self.budget_s - self.elapsed()

    def hang_s(self, expected_s: float, one_time_s: float = 0.0) -> float:
        """When a trial expected to take `expected_s` counts as hung: three times that (a first
        compile is hard to predict), at least TIMEOUT_FLOOR_S. A one-time cost within it
        (`one_time_s`: torchao's step compile, `TrialTimes.one_time_s`) is counted once, not
        tripled: it is known from the model's parameter shapes, and a hung trial's wait is time
        no trial gets. (Left out, EfficientNet-B0's step compile of about 70 shapes was stopped
        as hung after 68 s.)"""
        return min(self.trial_timeout_s,
                   max(TIMEOUT_FLOOR_S, 3 * (expected_s - one_time_s) + 30 + one_time_s))

    def timeout(self, expected_s: float, by_budget_end: bool = False,
                one_time_s: float = 0.0, guessed: bool = False) -> float:
        """When a trial is stopped: when it counts as hung (`hang_s`), and within a time budget
        no later than its `limit`. Without a time budget, a trial `guessed` at (no step of the
        model measured yet: the search's first trials) is given its limit, the user's
        --trial-timeout, not three times a guess: Gemma 3's shape on two CPU cores took over six
        minutes for its first forward, where its baseline was given 81 s."""
        if guessed and not self.budget_s:
            return self.limit(expected_s, by_budget_end)
        return min(self.hang_s(expected_s, one_time_s), self.limit(expected_s, by_budget_end))

    def limit(self, expected_s: float, by_budget_end: bool = False) -> float:
        """The longest a trial whose steps still come may run (`step_pace.py`): the user's
        --trial-timeout, and within a time budget no later than its end plus the trial's
        expected time, at most OVERRUN_SHARE of the budget (`by_budget_end`: plus GRACE_S)."""
        if not self.budget_s:
            return self.trial_timeout_s
        past = GRACE_S if by_budget_end else min(
            max(TIMEOUT_FLOOR_S, expected_s), max(GRACE_S, OVERRUN_SHARE * self.budget_s))
        return min(self.trial_timeout_s, max(0.0, self.time_left()) + past)

    def cut_short(self, result: TrialResult, timeout: float, planned_s: float,
                  one_time_s: float = 0.0, limit: float | None = None) -> TrialResult:
        """A trial stopped by a timeout the time budget's end made shorter than a hang's, or
        stopped with its steps still coming at a `limit` the budget's end set, is marked
        "timeout", not "crash": the search stopped it, nothing says it failed (its options take
        no blame for it). One still stepping at the user's --trial-timeout stays a "crash" row
        that says so."""
        if not gave_no_result(result):
            return result
        if stopped_while_stepping(result):
            if limit is None or limit >= self.trial_timeout_s:
                return result
            return replace(result, status="timeout",
                           message=f"stopped at the time budget's end: {result.message}")
        if timeout >= self.hang_s(planned_s, one_time_s):
            return result
        return replace(result, status="timeout", message=(
            f"stopped at the time budget's end after {timeout:.0f} s (planned to take "
            f"{planned_s:.0f} s)"))

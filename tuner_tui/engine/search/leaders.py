"""The leaders' interleaved re-measure within a search: when it is due, what one more run of a
leader takes (a warm compile and the repeat's steps), and its rounds run in the time left, each
only where it still fits. Who leads and what the runs say are `engine/remeasure.py`'s; this
module plans and runs them for the search driver. Torch-free."""

from __future__ import annotations

import math

from strategies.config import TuneConfig
from tuner_tui import format as fmt
from tuner_tui.engine import remeasure
from tuner_tui.engine.noise import spread
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.executor import error_row
from tuner_tui.engine.search.plan import Event
from tuner_tui.engine.search.proposal import expected_improvement
from tuner_tui.engine.search.timing import stepping
from tuner_tui.engine.table import summary

REMEASURED_LEADERS = 2
"""The leaders re-measured: the best and the closest one behind it."""
RUN_NOISE = 0.02
"""How far one run's throughput may lie from another run's of the same configuration, at least
(a standard deviation, relative): the leaders' interleaved re-measures on the H200 read +-0.7%
to +-2.2% (docs/search.md), wider than one run's spread of steps."""


class LeaderRemeasure:
    """The re-measures of one search (`search`: the driver, whose history, clock, trial runner
    and time line they use), their verdicts, and the note where none could run."""

    def __init__(self, search) -> None:
        self.search = search
        self.verdicts: list[remeasure.Verdict] = []
        self.done: list[frozenset[str]] = []
        """The sets of leaders already re-measured (a new leader makes a new set)."""
        self.note = ""

    def repeat_s(self, r: TrialResult) -> float:
        """One more run of a measured configuration, compiled again from the cache."""
        s = self.search
        first = r.compile_s or 0.0
        if r.tune_config.compile_mode != "off":
            first = s.times.warm_compile_s(r.tune_config, first)
        steps = sum(stepping(r.tune_config, s.plan.warmup_steps,
                             remeasure.repeat_steps(s.plan.steps), s.default_batch))
        return s.times.start_s() + first + steps * (r.step_ms or 0.0) / 1e3

    def leaders(self) -> list[TrialResult]:
        return remeasure.leaders(self.search.history.eligible(), limit=REMEASURED_LEADERS)

    def due(self) -> bool:
        if self.search.plan.remeasure_repeats < 1:
            return False
        leading = self.leaders()
        return len(leading) >= 2 and frozenset(r.label for r in leading) not in self.done

    def plan(self, left: float) -> tuple[list[TrialResult], int, float] | None:
        return remeasure.fitting(self.leaders(), self.search.plan.remeasure_repeats,
                                 self.repeat_s, left)

    def reserve_s(self, left: float) -> float:
        """What the re-measure still due will take out of the `left` seconds (0 if none)."""
        found = self.worth(left)
        return found[1] if found else 0.0

    def worth(self, left: float) -> tuple[float, float] | None:
        """What the re-measure still due is worth and takes, as (log throughput, seconds): the
        throughput expected lost by naming the first measurements' leader where one behind it
        is the faster (each measurement off by its spread, at least RUN_NOISE); None where none
        is due or fits in the `left` seconds. A trial that expects more per second may take its
        time (the leaders then stand on their first measurements)."""
        found = self.plan(left) if self.due() else None
        if found is None:
            return None
        leading, _, seconds = found
        best = leading[0]

        def sd(r: TrialResult) -> float:
            return max(spread(r) or 0.0, RUN_NOISE)

        value = sum(expected_improvement(math.log(r.tokens_per_s), math.hypot(sd(best), sd(r)),
                                         math.log(best.tokens_per_s)) for r in leading[1:])
        return value, seconds

    def run(self) -> bool:
        """Re-measure the leaders, as many rounds as fit in the time left; False where not even
        one fits (then the first measurements decide, and the report says so)."""
        s = self.search
        leading = self.leaders()
        self.done.append(frozenset(r.label for r in leading))
        left = s.time_left()
        plan = self.plan(left)
        if plan is None:
            needed = sum(self.repeat_s(r) for r in leading)
            # After a verdict, name the leaders this note is about: a later trial made them
            which = (" (" + " and ".join(r.label for r in leading) + ")") if self.verdicts else ""
            self.note = (
                f"time budget: the leaders{which} were not re-measured "
                f"({fmt.clock(max(0.0, left))} left, about {fmt.clock(needed)} needed); the "
                "first measurements decide")
            s.say(self.note)
            return False
        leading, repeats, cost = plan
        third = cost + cost / repeats <= left
        steps = remeasure.repeat_steps(s.plan.steps)
        walls: dict[str, float] = {}  # each leader's last repeat, in seconds

        def round_fits() -> bool:
            """The next round fits in the time left, as long as the last one took (a warm
            compile took 0.1 to 0.6 of the cold one on the H200: the plan can be short)."""
            return sum(walls.get(r.tune_config.label(), self.repeat_s(r))
                       for r in leading) <= s.time_left()

        def run(config: TuneConfig, index: int, total: int) -> TrialResult:
            began = s.elapsed()
            s.progress.begin(index, total, config.label(skip=s.skip),
                             "re-measuring the leaders, interleaved")
            try:
                original = s.history.get(config)
                expected = walls.get(config.label()) or (
                    self.repeat_s(original) if original is not None else 0.0)
                if s.plan.budget_s and expected > s.time_left():
                    result = out_of_time(config, "not run: the time budget ended")
                else:
                    result = s.run_trial(config, (), steps, early_stop=False,
                                         timeout=s.timeout(expected, by_budget_end=True))
                    if s.plan.budget_s and result.status != "ok" and s.time_left() <= 0:
                        result = out_of_time(config, "stopped at the end of the time budget")
            except Exception as exc:
                result = error_row(config, exc)
            s.end_line(summary(result))
            walls[config.label()] = s.elapsed() - began
            s.timeline.append(Event(len(s.timeline) + 1, "remeasure", result.label,
                                    result.status, "ran", "re-measuring the leaders", began,
                                    s.elapsed(), result.tokens_per_s, *s.best_now(),
                                    phases_s=result.phases_s))
            return result

        verdict = remeasure.remeasure(leading, run, repeats, third=third, round_fits=round_fits)
        if verdict is not None:
            self.verdicts.append(verdict)
            s.say(verdict.text())
        return True


def out_of_time(config: TuneConfig, why: str) -> TrialResult:
    """A repeat the time budget ended (or left no room for): no verdict, not a failure of the
    configuration."""
    return TrialResult(config=config.to_dict(), label=config.label(),
                       status=remeasure.OUT_OF_TIME, message=why)


__all__ = ["LeaderRemeasure", "REMEASURED_LEADERS"]

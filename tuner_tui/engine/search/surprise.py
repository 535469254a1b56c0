"""A contender measured far below its prediction runs once more before it is believed: a
disturbed run (another process on the GPU, a clock throttled for the run) must not close a
direction the priors said pays. The faster of the two runs stands (a disturbance only ever
slows a run). Torch-free."""

from __future__ import annotations

import math
from dataclasses import replace

from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.executor import error_row
from tuner_tui.engine.search.plan import Event
from tuner_tui.engine.search.proposal import Proposal
from tuner_tui.engine.table import summary

SURPRISE_SDS = 4.0
"""A trial measured this many of its prediction's deviations (and 5%) below what was expected
of it runs once more ..."""
SURPRISE_SHARE = 0.2
"""... where running it again takes at most this share of the time left: disturbances are rare,
and on a large model one more run can cost a compiled trial (llama-1b on the H200: 52 s of the
195 s left)."""
WHY = "measured far below its prediction: once more"


def confirm_surprise(search, proposal: Proposal, result: TrialResult) -> TrialResult:
    """`result` of `proposal`, or its second run where that was due and ran faster (`search`:
    the driver, whose history, clock, trial runner, store and time line it uses)."""
    top = search.history.best()
    if (proposal.mean is None or result.status not in ("ok", "stopped")
            or not result.tokens_per_s or top is None):
        return result
    measured = math.log(result.tokens_per_s)
    expected = proposal.mean - SURPRISE_SDS * max(proposal.sd, 0.01) - 0.05
    if measured >= expected or proposal.mean < math.log(top.tokens_per_s):
        return result  # as expected, or not expected to beat the best anyway
    repeat_s = search.leaders.repeat_s(result)
    if repeat_s > SURPRISE_SHARE * search.time_left():
        return result
    config = proposal.config
    began = search.elapsed()
    search.begin(config, WHY)
    try:
        again = search.run_trial(config, search.refs.for_config(config),
                                 search.steps_for(config), timeout=search.timeout(repeat_s))
    except Exception as exc:
        again = error_row(config, exc)
    search.end_line(summary(again))
    search.timeline.append(Event(len(search.timeline) + 1, "confirm", again.label, again.status,
                                 "ran", WHY, began, search.elapsed(), again.tokens_per_s,
                                 *search.best_now()))
    if again.status in ("ok", "stopped") and (again.tokens_per_s or 0) > result.tokens_per_s:
        again = replace(again, memory_estimate=result.memory_estimate)
        search.supersede(config, result, again)
        search.store.record(again, search.environment, search.workload_key,
                            search.steps_for(config), search.plan.warmup_steps)
        return again
    return result


__all__ = ["SURPRISE_SDS", "SURPRISE_SHARE", "confirm_surprise"]

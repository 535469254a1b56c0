"""Re-measuring the leading candidates interleaved (A B A B ...) before a winner is named.

One measurement of a configuration is one process at one moment: a busy host, a warmer GPU or a
lucky memory layout moves it by a few percent. So `tune` and `bench --export` run the leaders
again, alternating, each run in a fresh worker, combine the repeats, and call a difference
smaller than the combined spread a tie, which the simpler configuration wins. Torch-free.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from strategies.config import TuneConfig
from tuner_tui import format as fmt
from tuner_tui.engine import noise
from tuner_tui.engine.protocol import TrialResult

REPEATS = 2
"""Runs per leader: two alternations (A B A B) show the run-to-run spread at the least cost."""
MAX_STEPS = 10
"""Measured steps per repeat: a median of 10 steps is steady on a GPU; the repeats are extra."""
MAX_LEADERS = 3
LEADER_SPREADS = 3.0
"""A row is a leader when its tokens/s lie within this many combined spreads of the best ..."""
MIN_LEADER_GAP = 0.03
"""... or within 3% of it: one process's step spread understates the run-to-run spread."""


def leaders(eligible: Sequence[TrialResult], limit: int = MAX_LEADERS) -> list[TrialResult]:
    """The best row and the next ones close enough to it that one measurement cannot order
    them; at most `limit`."""
    ranked = sorted((r for r in eligible if r.tokens_per_s), key=lambda r: -r.tokens_per_s)
    if not ranked:
        return []
    best = ranked[0]
    chosen = [best]
    for r in ranked[1:limit]:
        gap = 1 - r.tokens_per_s / best.tokens_per_s
        allowed = LEADER_SPREADS * noise.tie_gap(noise.spread(best) or 0, noise.spread(r) or 0)
        if gap <= max(MIN_LEADER_GAP, allowed):
            chosen.append(r)
    return chosen


@dataclass
class Remeasured:
    """One leader: its first measurement and its interleaved repeats."""

    original: TrialResult
    repeats: list[TrialResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.original.label

    def failed(self) -> TrialResult | None:
        return next((r for r in self.repeats if r.status != "ok" or not r.tokens_per_s), None)

    @property
    def tokens_per_s(self) -> float | None:
        if not self.repeats or self.failed() is not None:
            return None
        return statistics.median(r.tokens_per_s for r in self.repeats)

    @property
    def spread(self) -> float:
        """The larger of the repeats' own step spread (median of them) and the spread between
        the repeats (half their range, relative to their median)."""
        if self.tokens_per_s is None:
            return 0.0
        within = statistics.median(noise.spread(r) or 0.0 for r in self.repeats)
        values = [r.tokens_per_s for r in self.repeats]
        between = (max(values) - min(values)) / 2 / self.tokens_per_s
        return max(within, between)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "config": self.original.config,
            "first_tokens_per_s": self.original.tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            "spread": self.spread if self.tokens_per_s else None,
            "repeats": [
                {"status": r.status, "tokens_per_s": r.tokens_per_s, "step_ms": r.step_ms,
                 "step_ms_q1": r.step_ms_q1, "step_ms_q3": r.step_ms_q3,
                 "measured_steps": r.measured_steps, "message": r.message}
                for r in self.repeats
            ],
        }


@dataclass
class Verdict:
    candidates: list[Remeasured]
    winner: TrialResult | None
    """The first measurement's row of the configuration that won; None: every repeat failed."""
    tie: bool = False
    fastest: Remeasured | None = None

    def text(self) -> str:
        """e.g. "re-measured interleaved: A 504k ±1.2%, B 498k ±0.9%: tie, A wins as the
        simpler configuration"."""
        figures = []
        for c in self.candidates:
            bad = c.failed()
            figures.append(f"{c.label} {bad.status}" if bad is not None else
                           f"{c.label} {fmt.si(c.tokens_per_s)} ±{c.spread:.1%}")
        head = f"re-measured interleaved ({len(self.candidates[0].repeats)} runs each): " + ", ".join(figures)
        if self.winner is None:
            return head + ": every repeat failed"
        if self.tie:
            simpler = "" if self.fastest is not None and self.fastest.original is self.winner \
                else " as the simpler configuration"
            return head + f": tie, {self.winner.label} wins{simpler}"
        others = [c for c in self.candidates if c.original is not self.winner and c.tokens_per_s]
        if not others:
            return head + f": {self.winner.label} is the only one that ran again"
        second = max(others, key=lambda c: c.tokens_per_s)
        gain = self.fastest.tokens_per_s / second.tokens_per_s - 1
        return head + f": {self.winner.label} faster by {gain:.1%}, more than the spread"

    def to_dict(self) -> dict:
        return {
            "candidates": [c.to_dict() for c in self.candidates],
            "winner": self.winner.label if self.winner else None,
            "tie": self.tie,
            "text": self.text(),
        }


def decide(candidates: list[Remeasured]) -> Verdict:
    """The fastest of the repeats, unless a simpler one lies within the spread of it (a tie):
    then the simplest of those tied (fewer options changed, then less peak memory)."""
    ran = [c for c in candidates if c.tokens_per_s]
    if not ran:
        return Verdict(candidates, None)
    fastest = max(ran, key=lambda c: c.tokens_per_s)
    tied = [c for c in ran if c is fastest
            or 1 - c.tokens_per_s / fastest.tokens_per_s < noise.tie_gap(c.spread, fastest.spread)]
    winner = min(tied, key=lambda c: (noise.simplicity(c.original.config, c.original.peak_memory_bytes),
                                      -c.tokens_per_s))
    return Verdict(candidates, winner.original, tie=len(tied) > 1, fastest=fastest)


def remeasure(
    leading: Sequence[TrialResult],
    run: Callable[[TuneConfig, int, int], TrialResult],
    repeats: int = REPEATS,
) -> Verdict | None:
    """Run each leader `repeats` times, alternating (A B A B ...); `run(config, index, total)`
    measures one configuration in a fresh worker. None with fewer than two leaders."""
    if len(leading) < 2 or repeats < 1:
        return None
    candidates = [Remeasured(r) for r in leading]
    total = repeats * len(candidates)
    index = 0
    for _ in range(repeats):
        for c in candidates:
            index += 1
            c.repeats.append(run(c.original.tune_config, index, total))
    return decide(candidates)


def expected_s(result: TrialResult, wall_s: dict[str, float]) -> float:
    """Seconds one more run of this row is expected to take: its first run's wall time where
    this search measured it (worker start and compile included), else its compile time and
    steps (a row reused from the store)."""
    if result.label in wall_s:
        return wall_s[result.label]
    steps = MAX_STEPS + 2  # the repeat's steps and a warm-up
    return (result.compile_s or 0.0) + steps * (result.step_ms or 0.0) / 1e3


def cost_s(leading: Sequence[TrialResult], wall_s: dict[str, float], repeats: int) -> float:
    """Seconds re-measuring these leaders `repeats` times each is expected to take."""
    return repeats * sum(expected_s(r, wall_s) for r in leading)


def reserve_s(eligible: Sequence[TrialResult], wall_s: dict[str, float], repeats: int) -> float:
    """Seconds a time budget must still hold for one more trial to start: the trial itself (a
    typical trial of this search) and, since it may become a leader, re-measuring it beside the
    best so far, or the two leaders of now where that costs more. Without the trial's own share
    a trial started with seconds left (seen on the H200: the last trial began 4 s before the
    end, became a leader, and nothing was re-measured). 0 until a trial is eligible (fits and
    keeps the loss): until one does, finding it is worth the whole budget."""
    leading = leaders(eligible)[:2]
    if not leading or not wall_s:
        return 0.0
    typical = statistics.median(wall_s.values())
    beside_best = repeats * (expected_s(leading[0], wall_s) + typical)
    return typical + max(beside_best, cost_s(leading, wall_s, repeats))


def within_time(leading: Sequence[TrialResult], wall_s: dict[str, float], repeats: int,
                seconds: float) -> list[TrialResult]:
    """The leaders, best first, whose repeats fit in `seconds` together; [] when even the first
    two do not (then nothing is re-measured)."""
    count = 0
    while count < len(leading) and cost_s(leading[:count + 1], wall_s, repeats) <= seconds:
        count += 1
    return list(leading[:count]) if count >= 2 else []


def repeat_steps(steps: int) -> int:
    return max(1, min(steps, MAX_STEPS))

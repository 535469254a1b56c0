"""Re-measuring the leading candidates interleaved (A B A B ...) before a winner is named.

One measurement of a configuration is one process at one moment: a busy host, a warmer GPU or a
lucky memory layout moves it by a few percent. So `tune` and `bench --export` run the leaders
again, alternating, each run in a fresh worker with the trial's own warm-up and steps, and
combine every run, the first measurement included. A difference smaller than the combined
spread is a tie, which the simpler configuration wins. Runs of one configuration that disagree
far beyond their spread were disturbed: no verdict is drawn from them. A verdict that overturns
the first measurements' order by more than their spread needs one more round. Torch-free.
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
"""Runs per leader in `bench`: two alternations (A B A B) show the run-to-run spread at the
least cost."""
SEARCH_REPEATS = 1
"""Runs per leader in `tune`, whose time budget pays for each run with a trial not run: one
alternation (A B), the first measurement counted beside it, and a second where the two
contradict the first measurements. 2000 simulated searches at five minutes, paired against two:
regret 5.43% -> 5.17% (-0.26% +- 0.05) and, on oracles not used to choose it, 5.01% -> 4.86%
(-0.15% +- 0.05); without any re-measure 5.06% (-0.37% +- 0.11), but then one measurement of
half the steps names the winner."""
MAX_LEADERS = 3
LEADER_SPREADS = 3.0
"""A row is a leader when its tokens/s lie within this many combined spreads of the best ..."""
MIN_LEADER_GAP = 0.03
"""... or within 3% of it: one process's step spread understates the run-to-run spread."""
DISTURBED_SPREADS = 4.0
"""A leader's runs (its first measurement and its repeats) that differ by more than this many
of their own spreads ..."""
DISTURBED_GAP = 0.06
"""... and by more than 6% were disturbed (another process on the GPU, a throttling clock): no
verdict is drawn from them."""


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


OUT_OF_TIME = "out-of-time"
"""A repeat's status where the time budget ended it or left no room for it."""


@dataclass
class Remeasured:
    """One leader: its first measurement and its interleaved repeats. The first measurement
    counts as one run among them."""

    original: TrialResult
    repeats: list[TrialResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.original.label

    def failed(self) -> TrialResult | None:
        return next((r for r in self.repeats if r.status != "ok" or not r.tokens_per_s), None)

    def out_of_time(self) -> bool:
        """A repeat the time budget ended or left no room for."""
        return any(r.status == OUT_OF_TIME for r in self.repeats)

    def runs(self) -> list[TrialResult]:
        return [self.original, *self.repeats]

    @property
    def tokens_per_s(self) -> float | None:
        """The median of every run, the first included; None when a repeat failed."""
        if not self.repeats or self.failed() is not None:
            return None
        return statistics.median(r.tokens_per_s for r in self.runs())

    def within(self) -> float:
        """The runs' own step spread (the median of theirs)."""
        return statistics.median(noise.spread(r) or 0.0 for r in self.runs())

    def variation(self) -> float:
        """How far apart the runs are: their range relative to their median."""
        values = [r.tokens_per_s for r in self.runs()]
        return (max(values) - min(values)) / statistics.median(values)

    @property
    def spread(self) -> float:
        """The larger of the runs' own step spread and half their range (relative)."""
        if self.tokens_per_s is None:
            return 0.0
        return max(self.within(), self.variation() / 2)

    def disturbed(self) -> bool:
        """The runs disagree beyond their own spread: something else moved them."""
        if self.tokens_per_s is None:
            return False
        return self.variation() > max(DISTURBED_SPREADS * self.within(), DISTURBED_GAP)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "config": self.original.config,
            "first_tokens_per_s": self.original.tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            "spread": self.spread if self.tokens_per_s else None,
            "disturbed": self.disturbed(),
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
    disturbed: bool = False
    """A leader's runs disagreed beyond their spread: the first measurements decided."""
    out_of_time: bool = False
    """The time budget ended a leader's repeats: the first measurements decided."""

    def text(self) -> str:
        """e.g. "re-measured interleaved: A 504k ±1.2%, B 498k ±0.9%: tie, A wins as the
        simpler configuration"."""
        figures = []
        for c in self.candidates:
            bad = c.failed()
            if bad is not None:
                figures.append(f"{c.label} {bad.status}")
                continue
            figure = f"{c.label} {fmt.si(c.tokens_per_s)} ±{c.spread:.1%}"
            if c.disturbed():
                figure += f" (its runs varied by {c.variation():.0%}: disturbed)"
            figures.append(figure)
        runs = max(len(c.repeats) for c in self.candidates)
        head = (f"re-measured interleaved ({runs} more run{'s' if runs != 1 else ''} each, the "
                "first counted): " + ", ".join(figures))
        if self.winner is None:
            return head + ": every repeat failed"
        if self.out_of_time:
            return head + (f": the time budget ended the repeats, no verdict; the first "
                           f"measurements decide: {self.winner.label}")
        if self.disturbed:
            return head + (f": disturbed, no verdict; the first measurements decide: "
                           f"{self.winner.label}")
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
            "disturbed": self.disturbed,
            "out_of_time": self.out_of_time,
            "text": self.text(),
        }

    def contradicts_first(self) -> bool:
        """The repeats name another winner than the first measurements did, and the first
        measurements were not a tie: a third run must settle it."""
        if self.winner is None or self.tie or self.disturbed or self.out_of_time:
            return False
        first = max(self.candidates, key=lambda c: c.original.tokens_per_s or 0)
        if first.original is self.winner:
            return False
        mine = next(c for c in self.candidates if c.original is self.winner)
        gap = 1 - (mine.original.tokens_per_s or 0) / first.original.tokens_per_s
        return gap > noise.tie_gap(noise.spread(first.original) or 0,
                                   noise.spread(mine.original) or 0)


def _simplest(tied: list[Remeasured], speed) -> Remeasured:
    return min(tied, key=lambda c: (noise.simplicity(c.original.config, c.original.peak_memory_bytes),
                                    -speed(c)))


def decide(candidates: list[Remeasured]) -> Verdict:
    """The fastest over all runs, unless a simpler one lies within the spread of it (a tie): then
    the simplest of those tied (fewer options changed, then less peak memory). Where a leader's
    runs were disturbed, no verdict: the first measurements decide, ties to the simpler."""
    ran = [c for c in candidates if c.tokens_per_s]
    late = any(c.out_of_time() for c in candidates)
    if late:  # (a leader the time budget cut short is still a leader)
        ran = [c for c in candidates if c.tokens_per_s or c.out_of_time()]
    if not ran:
        return Verdict(candidates, None)
    if late or any(c.disturbed() for c in ran):
        first = max(ran, key=lambda c: c.original.tokens_per_s)
        tied = [c for c in ran if c is first or 1 - c.original.tokens_per_s / first.original.tokens_per_s
                < noise.tie_gap(noise.spread(c.original) or 0, noise.spread(first.original) or 0)]
        winner = _simplest(tied, lambda c: c.original.tokens_per_s)
        return Verdict(candidates, winner.original, tie=len(tied) > 1, fastest=first,
                       disturbed=not late, out_of_time=late)
    fastest = max(ran, key=lambda c: c.tokens_per_s)
    tied = [c for c in ran if c is fastest
            or 1 - c.tokens_per_s / fastest.tokens_per_s < noise.tie_gap(c.spread, fastest.spread)]
    winner = _simplest(tied, lambda c: c.tokens_per_s)
    return Verdict(candidates, winner.original, tie=len(tied) > 1, fastest=fastest)


def remeasure(
    leading: Sequence[TrialResult],
    run: Callable[[TuneConfig, int, int], TrialResult],
    repeats: int = REPEATS,
    third: bool = True,
    round_fits: Callable[[], bool] = lambda: True,
) -> Verdict | None:
    """Run each leader `repeats` times, alternating (A B A B ...); `run(config, index, total)`
    measures one configuration in a fresh worker. Where the repeats overturn the first
    measurements' order by more than their spread, one more round decides (if `third`). Each
    round after the first runs only where `round_fits()` (the time left holds it, as the last
    round took): the verdict then rests on the rounds that ran. None with fewer than two
    leaders."""
    if len(leading) < 2 or repeats < 1:
        return None
    candidates = [Remeasured(r) for r in leading]
    total = repeats * len(candidates)
    index = 0

    def round_(total: int) -> None:
        nonlocal index
        for c in candidates:
            index += 1
            c.repeats.append(run(c.original.tune_config, index, total))

    for n in range(repeats):
        if n and not round_fits():
            break
        round_(total)
    _drop_cut_round(candidates)
    verdict = decide(candidates)
    if third and verdict.contradicts_first() and round_fits():
        round_(total + len(candidates))
        _drop_cut_round(candidates)
        verdict = decide(candidates)
    return verdict


def _drop_cut_round(candidates: list[Remeasured]) -> None:
    """Where the time budget cut a round short after a whole one ran, the verdict rests on the
    whole rounds (the cut one's runs are dropped); cut in the first, the first measurements
    decide (`decide`)."""
    whole = 0
    for i in range(min(len(c.repeats) for c in candidates)):
        if any(c.repeats[i].status == OUT_OF_TIME for c in candidates):
            break
        whole += 1
    if whole and any(c.out_of_time() for c in candidates):
        for c in candidates:
            del c.repeats[whole:]


def fitting(leading: Sequence[TrialResult], repeats: int,
            repeat_s: Callable[[TrialResult], float], left: float
            ) -> tuple[list[TrialResult], int, float] | None:
    """The leaders, the repeats each and the seconds it takes, as many repeats as fit in `left`
    (at most `repeats`); None where not even one round fits."""
    for n in range(repeats, 0, -1):
        cost = n * sum(repeat_s(r) for r in leading)
        if cost <= left:
            return list(leading), n, cost
    return None


def repeat_steps(steps: int) -> int:
    """A repeat measures as many steps as the trial did, after the same warm-up."""
    return max(1, steps)

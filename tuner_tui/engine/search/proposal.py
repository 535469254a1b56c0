"""What a search strategy is and what it proposes: the strategy's interface, a proposal (a
configuration to measure, why, and what it is expected to give), a parent (a configuration moves
are made from) and the expected improvement a proposal is ranked by. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from strategies.config import TuneConfig
from tuner_tui.engine.search.fit import normal_cdf
from tuner_tui.engine.search.history import History
from tuner_tui.engine.search.space import SearchSpace


class SearchStrategy:
    """Proposes the configurations to measure, a round at a time, from the results so far.
    A new strategy is one subclass: `propose` returns the next round ([] when done), and
    `remaining` estimates how many trials are still to come (for the progress line)."""

    ended = ""
    """Why the last call found no trial to propose, in words ('' where the strategy does not
    say); the report gives it where the search ends before its time budget."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def propose(self, history: History) -> list[TuneConfig]:
        raise NotImplementedError

    def remaining(self, history: History) -> int | None:
        """How many more trials it expects to propose; None where it cannot tell yet."""
        return 0


@dataclass(frozen=True)
class Proposal:
    """A configuration to measure, and why."""

    config: TuneConfig
    why: str
    parent: TuneConfig | None = None
    keys: tuple[str, ...] = ()
    """The options the move changes (what goes with them aside)."""
    mean: float | None = None
    """Predicted log tokens/s (None: no prediction), and its deviation."""
    sd: float = 0.0
    step_s: float | None = None
    """Predicted step time."""
    trial_s: float = 0.0
    """Predicted trial time, its reference run included."""
    score: float = 0.0


@dataclass(frozen=True)
class Parent:
    config: TuneConfig
    mean: float
    sd: float
    step_s: float | None
    measured: bool
    failed_compile: bool = False
    """It did not compile: its moves keep compiling (its eager versions are moves of the
    measured eager configurations, with the kernels eager execution pays for)."""
    optimizer_s: float | None = None
    """Measured: its optimizer step's part of step_s (what more micro-batches would share)."""


def expected_improvement(mean: float, sd: float, best: float) -> float:
    """E[max(0, X - best)] for X normal (mean, sd)."""
    if sd <= 1e-9:
        return max(0.0, mean - best)
    z = (mean - best) / sd
    return sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) + (mean - best) * normal_cdf(z)


def capped_improvement(mean: float, sd: float, best: float, cap: float) -> float:
    """E[max(0, min(X, cap) - best)] for X normal (mean, sd): where X cannot exceed `cap` (a
    move that only costs speed cannot beat its parent)."""
    if cap <= best:
        return 0.0
    if math.isinf(cap):
        return expected_improvement(mean, sd, best)
    if sd <= 1e-9:
        return max(0.0, min(mean, cap) - best)
    a, b = (best - mean) / sd, (cap - mean) / sd

    def density(z: float) -> float:
        return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    return (sd * (density(a) - density(b)) + (mean - best) * (normal_cdf(b) - normal_cdf(a))
            + (cap - best) * (1 - normal_cdf(b)))

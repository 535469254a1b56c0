"""What a candidate is expected to give and to take: its throughput predicted from all the runs
at once (`joint.py`) where that can be made, else from a measured configuration (its parent, or
one a move or two from it) by the priors, move by move; its step time, and its trial time, the
fp32 reference's run included where its batch has none yet. Torch-free.
"""

from __future__ import annotations

import math
from typing import Callable

from strategies.config import TuneConfig
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import computes_reference
from tuner_tui.engine.search.expert import variant
from tuner_tui.engine.search.history import History
from tuner_tui.engine.search.joint import JointModel
from tuner_tui.engine.search.moves import accumulated, options_moved
from tuner_tui.engine.search.priors import Estimate, Priors, accumulation_move, speed_known
from tuner_tui.engine.search.proposal import Parent, Proposal
from tuner_tui.engine.search.space import SearchSpace
from tuner_tui.engine.search.timing import TrialTimes

NEIGHBOUR_MOVES = 2
"""A candidate is moved from its parent (the incumbent, or a configuration that missed the
budget), but a measured configuration that differs from it in at most this many options may
know it better: the surer of the two predictions counts. After a compiled incumbent, its eager
variants were predicted from it by the priors (-12% +- 12%: worth a short trial each) while
the eager trials one option away had measured -30%. 2000 simulated searches at five minutes,
paired: 5.04% -> 4.62% (-0.42% +- 0.07) and, on oracles not used to choose it, 4.79% -> 4.42%
(-0.36% +- 0.07); neighbours one option away -0.12% +- 0.06, three away +0.01% +- 0.09 (models
under 300M +0.38%)."""


class Predictor:
    """Predictions for one search. `reference_ready(config)`: whether the fp32 reference's
    losses at the config's batch are known (else its trial includes the reference's run)."""

    def __init__(self, space: SearchSpace, priors: Priors, times: TrialTimes,
                 reference_ready: Callable[[TuneConfig], bool]) -> None:
        self.space = space
        self.priors = priors
        self.times = times
        self.reference_ready = reference_ready
        self.joint = JointModel()

    def batch(self, config: TuneConfig) -> int:
        return config.batch_size or self.space.default_batch

    def measured(self, r: TrialResult) -> Parent:
        return Parent(r.tune_config, math.log(r.tokens_per_s), 0.01,
                      (r.step_ms or 0) / 1e3 or None, True,
                      optimizer_s=(r.optimizer_ms or 0) / 1e3 or None)

    def step_s(self, parent: Parent, child: TuneConfig, gain: float) -> float | None:
        if parent.step_s is None:
            return None
        return parent.step_s * self.batch(child) / self.batch(parent.config) * math.exp(-gain)

    def predict(self, parent: Parent, child: TuneConfig, keys: tuple[str, ...]) -> Estimate:
        """The parent's throughput moved key by key (each move from where the last left it)."""
        total = Estimate(parent.mean, parent.sd)
        at = parent.config
        if "batch_size" in keys and "micro_batch_size" in keys:  # one move: the batch prior
            keys = tuple(k for k in keys if k != "micro_batch_size")  # weighs both at once
        for i, key in enumerate(keys):
            changes = {key: child[key]}
            if key == "batch_size":
                changes["micro_batch_size"] = child.micro_batch_size
            nxt = child if i == len(keys) - 1 else variant(self.space, at, **changes)
            if nxt is None:
                nxt = child
            physics = self._accumulation(parent, nxt) if at is parent.config else None
            total = total.plus(physics or self.priors.move(key, at, nxt))
            at = nxt
        return total

    def _accumulation(self, parent: Parent, child: TuneConfig) -> Estimate | None:
        """More or fewer micro-batches of the parent's size per optimizer step, predicted from
        the parent's measured step and optimizer step (`priors.accumulation_move`); None for
        any other move, or where the parent's optimizer step was not measured."""
        if parent.step_s is None or parent.optimizer_s is None or \
                (child.micro_batch_size or self.space.rank_batch(child)) != \
                (parent.config.micro_batch_size or self.space.rank_batch(parent.config)):
            return None
        k_from, k_to = accumulated(self.space, parent.config), accumulated(self.space, child)
        if k_from == k_to or options_moved(parent.config, child) not in (
                ("batch_size",), ("batch_size", "micro_batch_size")):
            return None
        return accumulation_move(parent.step_s, parent.optimizer_s, k_from, k_to)

    def estimate(self, parent: Parent, child: TuneConfig, keys: tuple[str, ...],
                 history: History) -> tuple[Estimate, float | None, float]:
        """The child's throughput, step time and trial time, predicted from all the runs at
        once (`joint.py`) where that can be made, else from the parent or a measured
        configuration a move or two from the child (NEIGHBOUR_MOVES), whichever is surer."""
        # All the runs at once (`joint.py`) wherever it can be made: it holds every run, where a
        # move holds one and its pairs. The moves' prediction is made only where the joint one
        # cannot be, or where the store taught the move from earlier searches, whose runs the
        # joint model lacks (then the surer counts).
        try:
            joint = self.joint.predict(child, history.all(), self.priors.ctx)
        except Exception:  # (a model that cannot be fitted leaves the moves' prediction)
            joint = None
        if joint is not None and not self.priors.stored & set(keys):
            guess = joint
        else:
            guess = self._from_measured(parent, child, keys, history)
            if joint is not None and joint.sd < guess.sd:
                guess = joint
        step = self.step_s(parent, child, guess.mean - parent.mean)
        return guess, step, self.trial_s(child, step, history)

    def _from_measured(self, parent: Parent, child: TuneConfig, keys: tuple[str, ...],
                       history: History) -> Estimate:
        """Moved from the parent, or from a measured configuration a move or two from the child
        (NEIGHBOUR_MOVES), whichever is surer."""
        guess = self.predict(parent, child, keys)
        for r in history.all():
            if not speed_known(r) or r.loss_ok is False or r.tune_config == parent.config:
                continue
            moved = options_moved(r.tune_config, child)
            if len(moved) <= NEIGHBOUR_MOVES:
                near = self.predict(self.measured(r), child, moved)
                if near.sd < guess.sd:
                    guess = near
        return guess

    def trial_s(self, config: TuneConfig, step_s: float | None, history: History,
                cached: bool = False) -> float:
        seconds = self.times.trial_s(config, step_s, cached=cached)
        if not computes_reference(config) and not self.reference_ready(config):
            base = history.get(self.space.start())
            fp32_step = ((base.step_ms or 0) / 1e3 * self.batch(config)
                         / self.batch(base.tune_config) if base is not None and base.step_ms
                         else None)
            seconds += self.times.reference_s(fp32_step)
        return seconds

    def from_start(self, config: TuneConfig, why: str, history: History) -> Proposal:
        """A configuration reached by several moves (the expert's recipe) from the baseline or,
        where the baseline did not run, the fp32 reference run that did."""
        ran = [r for r in history.all() if r.status in ("ok", "stopped") and r.tokens_per_s
               and computes_reference(r.tune_config)]
        base = history.get(self.space.start())
        if base is None or not base.tokens_per_s:
            base = ran[0] if ran else None
        if base is None:
            return Proposal(config, why, trial_s=self.times.trial_s(config, None))
        parent = self.measured(base)
        keys = options_moved(parent.config, config)
        guess, step, seconds = self.estimate(parent, config, keys, history)
        return Proposal(config, why, parent.config, keys, guess.mean, guess.sd, step, seconds)

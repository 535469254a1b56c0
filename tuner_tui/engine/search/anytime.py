"""The anytime search: the baseline, then the expert's recipe (`opening.py`: eager first, and
eager with each of a few of its decisions changed, then compiled), then always the trial with
the highest expected gain per second.

A candidate is a move from a measured configuration (a parent): one option to another of its
values, the batch doubled or halved, the micro-batch a step smaller or larger, or a larger
batch together with a memory lever. Its throughput is predicted from the parent's by the priors
(`prediction.py`, `priors.py`); its expected gain is how much it is expected to beat the best
configuration so far (the expected improvement of a normal prediction, in log throughput),
times the chance it works (failures of the same change), times the chance it fits the memory
budget (`fit.py`), divided by its expected trial time (`timing.py`). Parents are the incumbent
(the fastest configuration that fits and kept the numerics) and the faster configurations that
missed the budget, measured or predicted: from these, a memory lever that closes the gap for
little speed scores highest, so under a tight budget the search closes the gap cheaply and
stops at the first lever that fits. The same rule weighs memory levers as speed levers where
they pay (bf16 weights on a large model) and leaves those that cost much (offloaded state) for
when nothing else fits. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterator

from strategies.config import TuneConfig
from strategies.registry import OPTIONS, numerics_class
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.expert import memory_moves
from tuner_tui.engine.search.fit import NOT_FITTING, Footprint, normal_cdf
from tuner_tui.engine.search.history import History, config_key
from tuner_tui.engine.search.memory import measured_peak
from tuner_tui.engine.search.moves import SingleMoves, options_moved, show
from tuner_tui.engine.search.opening import Opening
from tuner_tui.engine.search.prediction import Predictor
from tuner_tui.engine.search.priors import FAILED, Context, Priors
from tuner_tui.engine.search.proposal import (
    Parent, Proposal, SearchStrategy, capped_improvement, expected_improvement,
)
from tuner_tui.engine.search.space import SearchSpace
from tuner_tui.engine.search.timing import TrialTimes

DONE_GAIN = 0.003
"""Without a time budget, the search ends when no candidate is expected to gain 0.3%; with one
it goes on while a trial fits in the time left."""
TIE = 0.02
"""Two measurements within this much (in log throughput) are as fast as each other: the
search moves from the leaner of the two as well."""
BOTTLENECK_WEIGHT = 1.5
"""With --profile: a move of an option that addresses the incumbent's bottleneck counts this
much more."""


class AnytimeSearch(SearchStrategy):
    """One search's strategy. `time_available()` says how many seconds a trial may still take
    (None: no limit); `reference_ready(config)` whether the fp32 reference's losses at its batch
    are known (else its trial includes the reference's run); `reference_check_s(config)` what
    checking its loss will take should it become the best (0 where no check is needed: at the
    run's batch, or numerics already checked); `remeasure_worth()` what the leaders'
    re-measure that `time_available` keeps time for is worth and takes (None: none is due)."""

    def __init__(self, space: SearchSpace, ctx: Context, *, items_per_sample: int = 1,
                 budget_bytes: int | None = None, device_bytes: int | None = None,
                 priors: Priors | None = None,
                 times: TrialTimes | None = None,
                 time_available: Callable[[], float | None] = lambda: None,
                 reference_ready: Callable[[TuneConfig], bool] = lambda c: True,
                 reference_check_s: Callable[[TuneConfig], float] = lambda c: 0.0,
                 remeasure_worth: Callable[[], tuple[float, float] | None] = lambda: None
                 ) -> None:
        super().__init__(space)
        self._ctx = ctx
        self.items_per_sample = items_per_sample
        self.budget_bytes = budget_bytes
        self.device_bytes = device_bytes
        self.priors = priors or Priors(ctx, space.canonical)
        self.times = times or TrialTimes(ctx.device, steps=20, warmup_steps=5)
        self.time_available = time_available
        self.reference_ready = reference_ready
        self.reference_check_s = reference_check_s
        self.remeasure_worth = remeasure_worth
        self.proposals: dict[str, Proposal] = {}
        self._moves = SingleMoves(space)
        self.footprint: Footprint | None = None
        self._pool_size: int | None = None
        """Moves worth a trial; None until the opening is over and the first pool is drawn."""
        self.last: Proposal | None = None
        # (through lambdas: a test or caller may set the callables above later)
        self.predictor = Predictor(space, self.priors, self.times,
                                   lambda config: self.reference_ready(config))
        self.opening = Opening(space, ctx, self.predictor, budget_bytes,
                               lambda: self.time_available(),
                               lambda config: self.reference_check_s(config))

    @property
    def ctx(self) -> Context:
        return self._ctx

    @ctx.setter
    def ctx(self, ctx: Context) -> None:
        """The driver's, once a trial counted the model's parameters (large or not)."""
        self._ctx = self.opening.ctx = ctx

    # -- the driver's side ---------------------------------------------------------------------
    def propose(self, history: History) -> list[TuneConfig]:
        proposal = self.next(history)
        return [proposal.config] if proposal is not None else []

    def next(self, history: History) -> Proposal | None:
        """The next trial, or None when no candidate is worth its time (or fits in it)."""
        self._footprint(history)
        start = self.space.start()
        if start not in history:
            return self._keep(Proposal(start, "the fp32 eager baseline", trial_s=self.times.trial_s(
                start, None)))
        opening = self.opening.next(history, self.footprint)
        if opening is not None:
            return self._keep(opening)
        best = self._best_candidate(history)
        return self._keep(best) if best is not None else None

    def observe(self, config: TuneConfig, result: TrialResult, wall_s: float,
                history: History) -> None:
        """A trial ended: learn its time, its outcome and its pairs with the trials before it."""
        self.times.observe(config, result, wall_s)
        self.priors.observe(config, result)
        measured = [(r.tune_config, r) for r in history.all() if r is not result]
        self.priors.learn_from(measured, config, result)

    def observe_check(self, config: TuneConfig, result: TrialResult) -> None:
        """A trial's loss was checked after it ran: kept or lost, the priors learn it."""
        self.priors.observe_check(config, result)

    def remaining(self, history: History) -> int | None:
        return self._pool_size

    def prediction(self, config: TuneConfig) -> Proposal | None:
        return self.proposals.get(config_key(config))

    # -- candidates ----------------------------------------------------------------------------
    def _keep(self, proposal: Proposal) -> Proposal:
        self.proposals[config_key(proposal.config)] = proposal
        self.last = proposal
        return proposal

    def _footprint(self, history: History) -> None:
        if self.footprint is None or self.footprint.history is not history:
            self.footprint = Footprint(history, self.space.default_batch, self.budget_bytes,
                                       self.device_bytes)

    def _parents(self, history: History) -> list[Parent]:
        """The incumbent, then up to two faster configurations that missed the budget (measured
        over it, or predicted faster and out of memory); without an incumbent, the fastest
        measured configuration or the baseline."""
        incumbent = history.best()
        found: list[Parent] = []
        if incumbent is not None:
            found.append(self.predictor.measured(incumbent))
        floor = math.log(incumbent.tokens_per_s) if incumbent is not None else -math.inf
        over = []
        for r in history.all():
            if r is incumbent:
                continue
            if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False \
                    and not history.fits(r) and math.log(r.tokens_per_s) > floor:
                over.append(self.predictor.measured(r))
            elif r.status in ("oom", "skipped") + FAILED:
                # Predicted, not measured: what it would have given had it fit (or run); the
                # moves from it that fit (or drop what failed) may give it still.
                guess = self._unmeasured(r.tune_config, found[0] if found else None)
                if guess is not None and guess.mean > floor:
                    over.append(replace(guess, failed_compile=r.status == "compile"))
        over.sort(key=lambda p: -p.mean)
        found += over[:2]
        if incumbent is not None and self.budget_bytes is not None:
            found += self._tied(history, incumbent)
        if incumbent is None and not over:
            ran = [r for r in history.all() if r.status in ("ok", "stopped") and r.tokens_per_s]
            if ran:
                found.append(self.predictor.measured(max(ran, key=lambda r: r.tokens_per_s)))
        return found

    def _unmeasured(self, config: TuneConfig, incumbent: Parent | None) -> Parent | None:
        """A configuration that did not fit (or run) as a parent: what it would have given,
        predicted again from the incumbent with what the search has learned since it was
        proposed (a guess made from the baseline before anything was measured kept a failed
        compile's children looking far faster than the trials near them measured)."""
        guess = self.proposals.get(config_key(config))
        if guess is None or guess.mean is None:
            return None
        if incumbent is None:
            return Parent(config, guess.mean, guess.sd, guess.step_s, False)
        keys = options_moved(incumbent.config, config)
        again = self.predictor.predict(incumbent, config, keys)
        step = self.predictor.step_s(incumbent, config, again.mean - incumbent.mean)
        return Parent(config, again.mean, again.sd, step, False)

    def _tied(self, history: History, incumbent: TrialResult) -> list[Parent]:
        """The configuration that fits and measured as fast as the incumbent (within TIE) with
        the least memory: the moves that do not fit from the incumbent (a larger micro-batch,
        checkpointing off) may fit from it."""
        floor = math.log(incumbent.tokens_per_s) - TIE
        own = measured_peak(incumbent) or 0
        ties = [r for r in history.eligible() if r is not incumbent and r.tokens_per_s
                and math.log(r.tokens_per_s) >= floor and (measured_peak(r) or own) < own]
        if not ties:
            return []
        return [self.predictor.measured(min(ties, key=lambda r: measured_peak(r) or own))]

    def moves(self, config: TuneConfig) -> Iterator[tuple[tuple[str, ...], TuneConfig]]:
        """Every single move from `config` (with the options it interacts with); and where a
        move would likely miss the budget (a larger batch, checkpointing taken off), the same
        with each memory lever that may bring it back."""
        singles = self._moves.singles(config)
        yield from singles
        if self.budget_bytes is None:
            return
        for keys, child in singles:
            if len(keys) > 1 or self.footprint.chance_to_fit(child) >= 0.5:
                continue
            for key, closer in memory_moves(self.space, child):
                if key not in keys and closer != config:
                    yield keys + (key,), closer

    def _best_candidate(self, history: History) -> Proposal | None:
        incumbent = history.best()
        best_log = math.log(incumbent.tokens_per_s) if incumbent is not None else None
        bottleneck = (incumbent.profile or {}).get("bottleneck") if incumbent is not None else None
        available = self.time_available()
        verified = {numerics_class(dict(r.tune_config.values)) for r in history.all() if r.loss_ok}
        worth = self.remeasure_worth() if available is not None else None
        seen: set[str] = set()
        pool: list[tuple[float, Proposal]] = []
        late = 0  # untried moves left out for the time they would take
        for parent in self._parents(history):
            for keys, child in self.moves(parent.config):
                if parent.failed_compile and child.compile_mode == "off":
                    continue
                key = config_key(child)
                # (every move takes values of the space: its children lie in it)
                if key in seen or child in history:
                    continue
                seen.add(key)
                guess, step, seconds = self.predictor.estimate(parent, child, keys, history)
                check_s = self.reference_check_s(child) if best_log is not None else 0.0
                # Its loss is checked after it ran, if it wins: charged as likely as the win.
                # Where its numerics class (fp16, float8) has not kept the loss anywhere in this
                # search yet, a win whose check finds no time left would be recommended on
                # trust: the check must fit.
                # A compile of a kind not measured yet must fit as long as the measured one.
                doubt_s = self.times.unmeasured_compile_doubt_s(child)
                # Ranked by a cold compile (`timing.py` says why), but a graph compiled before
                # comes from the cache: where no cold compile fits in the time left, a move
                # outside the graph (more micro-batches accumulated, another AdamW) still does.
                fit_s = self.predictor.trial_s(child, step, history, cached=True)
                if available is not None and check_s and seconds + check_s > available \
                        and numerics_class(dict(child.values)) not in verified:
                    late += 1
                    continue
                if check_s:
                    seconds += normal_cdf((guess.mean - best_log) / max(guess.sd, 1e-3)) * check_s
                if best_log is None:
                    gain = math.exp(guess.mean - 20)
                elif costs_only(parent.config, child, keys):
                    gain = capped_improvement(guess.mean, guess.sd, best_log, parent.mean)
                else:
                    gain = expected_improvement(guess.mean, guess.sd, best_log)
                gain *= self.priors.chance_it_works(child)
                if bottleneck and any(bottleneck in OPTIONS[k].search.addresses for k in keys):
                    gain *= BOTTLENECK_WEIGHT
                # Past the time kept for the leaders' re-measure only where the trial is worth
                # more per second than the re-measure.
                if available is not None and fit_s + doubt_s > available and not (
                        worth is not None and worth[1] > 0
                        and fit_s + doubt_s <= available + worth[1]
                        and gain / seconds > worth[0] / worth[1]):
                    late += 1
                    continue
                why = "move " + ", ".join(f"{k} {show(parent.config, k)} -> {show(child, k)}"
                                          for k in keys)
                if not parent.measured or (self.budget_bytes is not None
                                           and (measured_peak_of(history, parent.config) or 0)
                                           > self.budget_bytes):
                    why += " (to fit the budget)"
                pool.append((gain / seconds, Proposal(child, why, parent.config, keys, guess.mean,
                                                      guess.sd, step, seconds, gain)))
        pool.sort(key=lambda item: -item[0])
        floor = DONE_GAIN if available is None else 0.0
        self._pool_size = sum(1 for _, p in pool if p.score > max(floor, 0.01))
        best: Proposal | None = None
        best_value = 0.0
        for upper, proposal in pool:  # the chance to fit only as far as it can change the order
            if upper <= best_value:
                break
            if best_log is not None and proposal.score < floor:
                continue
            chance = self.footprint.chance_to_fit(proposal.config)
            if chance < NOT_FITTING:
                continue
            value = upper * chance
            if value > best_value:
                best, best_value = proposal, value
        if best is None:
            self.ended = "no untried move from the best configurations is expected to gain " \
                         "within the memory budget"
            if late:
                self.ended = f"{late} untried moves would take longer than the time left, and " \
                             "no other is expected to gain within the memory budget"
        return best


def costs_only(parent: TuneConfig, child: TuneConfig, keys: tuple[str, ...]) -> bool:
    """Every option the move changes goes from its default to a value that only costs speed
    (`SearchFacts.costs_only`: recomputation, offloaded state): the child cannot beat its
    parent, only hold less."""
    return bool(keys) and all(
        parent[k] == OPTIONS[k].default and child[k] in OPTIONS[k].search.costs_only
        for k in keys)


def measured_peak_of(history: History, config: TuneConfig) -> int | None:
    found = history.get(config)
    return measured_peak(found) if found is not None else None


__all__ = ["AnytimeSearch", "Proposal", "SearchStrategy"]

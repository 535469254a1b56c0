"""The anytime search: the baseline, then the expert's recipe (eager first, and eager with each
of a few of its decisions changed, then compiled), then always the trial with the highest
expected gain per second.

A candidate is a move from a measured configuration (a parent): one option to another of its
values, the batch doubled or halved, the micro-batch a step smaller or larger, or a larger
batch together with a memory lever. Its throughput is predicted from the parent's by the priors
(`priors.py`); its expected gain is how much it is expected to beat the best configuration so
far (the expected improvement of a normal prediction, in log throughput), times the chance it
works (failures of the same change), times the chance it fits the memory budget (`fit.py`),
divided by its expected trial time (`timing.py`). Parents are the incumbent (the fastest
configuration that fits and kept the numerics) and the faster configurations that missed the
budget, measured or predicted: from these, a memory lever that closes the gap for little speed
scores highest, so under a tight budget the search closes the gap cheaply and stops at the
first lever that fits. The same rule weighs memory levers as speed levers where they pay (bf16
weights on a large model) and leaves those that cost much (offloaded state) for when nothing
else fits. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterator

from strategies.config import TuneConfig
from strategies.registry import OPTIONS, numerics_class
from tuner_tui.engine.noise import spread, tie_gap
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import computes_reference
from tuner_tui.engine.search.expert import expert_recipe, memory_moves, variant
from tuner_tui.engine.search.fit import Footprint, normal_cdf
from tuner_tui.engine.search.history import History, config_key
from tuner_tui.engine.search.memory import measured_peak
from tuner_tui.engine.search.moves import SingleMoves, accumulated, options_moved, show
from tuner_tui.engine.search.priors import (FAILED, Context, Estimate, Priors, accumulation_move,
                                             move_prior, speed_known)
from tuner_tui.engine.search.proposal import Parent, Proposal, SearchStrategy, expected_improvement
from tuner_tui.engine.search.space import SearchSpace
from tuner_tui.engine.search.timing import TrialTimes

NOT_FITTING = 0.02
"""A candidate less likely than this to fit the budget is not run."""
DONE_GAIN = 0.003
"""Without a time budget, the search ends when no candidate is expected to gain 0.3%; with one
it goes on while a trial fits in the time left."""
TIE = 0.02
"""Two measurements within this much (in log throughput) are as fast as each other: the
search moves from the leaner of the two as well."""
CHECK_SHARE = 0.1
"""The expert's recipe grows the batch only where checking its loss there (an fp32 reference
run at that batch) takes at most this share of the time left."""
SCOUTED = ("batch_size", "weights", "fp8")
"""Between the expert's eager recipe and its compiled one, each of these changed in the eager
recipe, once (an eager trial costs seconds, a compiled one a compile): the compiled recipe takes
each change that ran faster. The expert keeps the run's batch where checking the loss at a
larger one would cost much (an fp32 reference of a model of a billion parameters), and bf16
weights pay on some large models, not on others. 1000 simulated searches at five minutes,
paired: the batch 5.06% -> 4.77% (-0.29% +- 0.06; a billion parameters and more -0.89%), the
weights after it 4.62% (-0.14% +- 0.06); on 1000 other oracles -0.35% +- 0.07 and -0.10% +-
0.06. The optimizer's state, scouted too, did not pay (+0.13%). Float8 is scouted otherwise:
where the compiled recipe has it, the eager recipe runs with it to see that it runs here and
keeps the loss (a float8 that fails, fails in seconds eager rather than after a compile of
minutes); where it failed, the compiled recipe goes without it. 5.17% -> 5.04% (-0.13% +- 0.07
paired; a billion parameters and more -0.41% +- 0.21), on 1000 other oracles 4.86% -> 4.79%
(-0.07% +- 0.04; -0.23% +- 0.13). Taking float8 by its eager speed as well (its prior under
compile moved by what eager measured beyond its eager prior) did no better on the other oracles."""
NEIGHBOUR_MOVES = 2
"""A candidate is moved from its parent (the incumbent, or a configuration that missed the
budget), but a measured configuration that differs from it in at most this many options may
know it better: the surer of the two predictions counts. After a compiled incumbent, its eager
variants were predicted from it by the priors (-12% +- 12%: worth a short trial each) while
the eager trials one option away had measured -30%. 2000 simulated searches at five minutes,
paired: 5.04% -> 4.62% (-0.42% +- 0.07) and, on oracles not used to choose it, 4.79% -> 4.42%
(-0.36% +- 0.07); neighbours one option away -0.12% +- 0.06, three away +0.01% +- 0.09 (models
under 300M +0.38%)."""
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
        self.ctx = ctx
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
        self.expert: TuneConfig | None = None
        self.expert_pending = False
        """The expert's compiled recipe is still to come after its eager version."""
        self.footprint: Footprint | None = None
        self._pool_size = 0
        self.last: Proposal | None = None
        self.eager: TuneConfig | None = None
        """The expert's recipe without compile, where it runs first."""
        self.scouts: list[TuneConfig] = []
        """The eager recipe with one of SCOUTED changed, as they ran."""
        self.scouted = 0
        """How many of SCOUTED were considered."""

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
        if self.expert is None:
            self.expert = self._expert_recipe(history)
            first = self._eager_first(history)
            if first is not None:
                return self._keep(first)
            if self.expert not in history:
                return self._keep(self._predicted(self.expert, "the expert's recipe", history))
        if self.expert not in history and self.expert_pending:
            scout = self._scout(history)
            if scout is not None:
                return self._keep(scout)
            self.expert_pending = False
            self.expert = self._scouted(history)
            expert = self._predicted(self.expert, "the expert's recipe", history)
            available = self.time_available()
            if available is None or expert.trial_s <= available:
                return self._keep(expert)
        best = self._best_candidate(history)
        return self._keep(best) if best is not None else None

    def _eager_first(self, history: History) -> Proposal | None:
        """The expert's recipe without torch.compile (with what pays without it: the fused
        kernels, no float8), measured before the compiled one, which follows where it still
        fits in the time left: an answer in seconds that a slow or failed compile cannot take
        away, and a second place to search from. The compiled recipe drops the fused kernels
        Inductor replaces; where the eager ones pay more than compiling does, a search that
        starts compiled seldom finds it (2000 simulated searches, regret 5.4% -> 5.1%; GPT-2 on
        the H200 ended eager with the kernels at batch 128, a tie with compiled)."""
        if self.expert.compile_mode == "off" or self.expert in history:
            return None
        eager = self._expert_recipe(history, eager=True)
        if eager in history or eager == self.expert:
            return None
        self.expert_pending = True
        self.eager = eager
        compiled = self._predicted(self.expert, "the expert's recipe", history)
        available = self.time_available()
        left = f" of the {available:.0f} s left" if available is not None else ""
        return self._predicted(
            eager, f"the expert's recipe without compile, first (compiling it would take about "
                   f"{compiled.trial_s:.0f} s{left})", history)

    def _scout(self, history: History) -> Proposal | None:
        """Between the two recipes, the eager one with one of SCOUTED changed, each once,
        where it likely fits the budget and leaves the compiled recipe its time."""
        ran = history.get(self.eager) if self.eager is not None else None
        if ran is None or ran.status != "ok" or not ran.tokens_per_s:
            return None
        while self.scouted < len(SCOUTED):
            key = SCOUTED[self.scouted]
            self.scouted += 1
            child = self._scout_child(key)
            if child is None or child in history or self.footprint.chance_to_fit(child) < 0.5:
                continue
            moved = options_moved(self.eager, child)
            parent = self._measured(ran)
            guess, step, seconds = self._estimate(parent, child, moved, history)
            available = self.time_available()
            compiled = self._predicted(self._scouted(history), "", history)
            if available is not None and seconds + compiled.trial_s > available:
                self.scouted = len(SCOUTED)
                return None
            self.scouts.append(child)
            why = (f"batch {self._batch(self.eager)} -> {self._batch(child)}"
                   if key == "batch_size" else
                   ", ".join(f"{k} {show(self.eager, k)} -> {show(child, k)}" for k in moved))
            return Proposal(child, f"the eager recipe with {why}, to tell the compiled one",
                            self.eager, moved, guess.mean, guess.sd, step, seconds)
        return None

    def _scout_child(self, key: str) -> TuneConfig | None:
        """The eager recipe with `key` changed: the batch doubled with its micro-batch (more
        micro-batches accumulated would not change the kernels' shapes); float8 as the compiled
        recipe has it (None where it has none); another option to its other value, with the
        options it interacts with at the values their priors expect the most of (fp32 weights
        with fused AdamW)."""
        eager = self.eager
        if key == "fp8":  # the compiled recipe's float8, run eager: does it work here?
            if self.expert.fp8 == "off" or eager.fp8 != "off":
                return None
            return variant(self.space, eager, fp8=self.expert.fp8)
        if key == "batch_size":
            child = next((c for c in self._moves.batch_moves(eager)
                          if self._batch(c) > self._batch(eager)), None)
            if child is None or accumulated(self.space, child) != accumulated(self.space, eager):
                return None
            return child
        others = [v for v in self.space.values(key) if v != eager[key]]
        child = variant(self.space, eager, **{key: others[0]}) if len(others) == 1 else None
        for partner in OPTIONS[key].search.interacts if child is not None else ():
            options = [c for v in self.space.values(partner)
                       if (c := variant(self.space, child, **{partner: v})) is not None]
            if options:
                child = max(options, key=lambda c: move_prior(partner, child, c, self.ctx).mean
                            if c != child else 0.0)
        return child

    def _scouted(self, history: History) -> TuneConfig:
        """The compiled recipe with each scout's change that ran faster than the eager recipe,
        where it likely still fits, and with the eager recipe's values where a scout failed
        (float8 that does not run here). Where the two differ by less than their spread (a
        tie), the change's prior under compile decides."""
        config = self.expert
        eager = history.get(self.eager)
        for scout in self.scouts:
            ran = history.get(scout)
            moved = options_moved(self.eager, scout)
            if ran is not None and ran.status in FAILED:  # (float8 that does not run here)
                config = variant(self.space, config, **{k: self.eager[k] for k in moved}) \
                    or config
                continue
            if ran is None or ran.status != "ok" or not ran.tokens_per_s:
                continue
            changed = variant(self.space, config, **{k: scout[k] for k in moved})
            if changed is None or self.footprint.chance_to_fit(changed) < 0.5:
                continue
            gain = math.log(ran.tokens_per_s / eager.tokens_per_s)
            if abs(gain) <= tie_gap(spread(ran) or 0.0, spread(eager) or 0.0):
                gain = self._predict(Parent(config, 0.0, 0.0, None, False), changed, moved).mean
            if gain > 0:
                config = changed
        return config

    def _expert_recipe(self, history: History, eager: bool = False) -> TuneConfig:
        """The expert's recipe; at the run's batch where checking the loss at the larger batch
        it would grow to would take more than CHECK_SHARE of the time left (an fp32 reference
        at four times the batch of a billion-parameter model: a quarter of five minutes)."""
        grown = expert_recipe(self.space, self.ctx, self.footprint, self.budget_bytes, eager=eager)
        available = self.time_available()
        if available is None or self.reference_check_s(grown) <= CHECK_SHARE * available:
            return grown
        return expert_recipe(self.space, self.ctx, self.footprint, self.budget_bytes,
                             eager=eager, grow_batch=False)

    def observe(self, config: TuneConfig, result: TrialResult, wall_s: float,
                history: History) -> None:
        """A trial ended: learn its time, its outcome and its pairs with the trials before it."""
        self.times.observe(config, result, wall_s)
        self.priors.observe(config, result)
        measured = [(r.tune_config, r) for r in history.all() if r is not result]
        self.priors.learn_from(measured, config, result)

    def remaining(self, history: History) -> int:
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

    def _batch(self, config: TuneConfig) -> int:
        return config.batch_size or self.space.default_batch

    def _step_s(self, parent: Parent, child: TuneConfig, gain: float) -> float | None:
        if parent.step_s is None:
            return None
        return parent.step_s * self._batch(child) / self._batch(parent.config) * math.exp(-gain)

    def _parents(self, history: History) -> list[Parent]:
        """The incumbent, then up to two faster configurations that missed the budget (measured
        over it, or predicted faster and out of memory); without an incumbent, the fastest
        measured configuration or the baseline."""
        incumbent = history.best()
        found: list[Parent] = []
        if incumbent is not None:
            found.append(self._measured(incumbent))
        floor = math.log(incumbent.tokens_per_s) if incumbent is not None else -math.inf
        over = []
        for r in history.all():
            if r is incumbent:
                continue
            if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False \
                    and not history.fits(r) and math.log(r.tokens_per_s) > floor:
                over.append(self._measured(r))
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
                found.append(self._measured(max(ran, key=lambda r: r.tokens_per_s)))
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
        again = self._predict(incumbent, config, keys)
        step = self._step_s(incumbent, config, again.mean - incumbent.mean)
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
        return [self._measured(min(ties, key=lambda r: measured_peak(r) or own))]

    def _measured(self, r: TrialResult) -> Parent:
        return Parent(r.tune_config, math.log(r.tokens_per_s), 0.01,
                      (r.step_ms or 0) / 1e3 or None, True,
                      optimizer_s=(r.optimizer_ms or 0) / 1e3 or None)

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

    def _predict(self, parent: Parent, child: TuneConfig, keys: tuple[str, ...]) -> Estimate:
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

    def _predicted(self, config: TuneConfig, why: str, history: History) -> Proposal:
        """A configuration reached by several moves (the expert's recipe) from the baseline or,
        where the baseline did not run, the fp32 reference run that did."""
        ran = [r for r in history.all() if r.status in ("ok", "stopped") and r.tokens_per_s
               and computes_reference(r.tune_config)]
        base = history.get(self.space.start())
        if base is None or not base.tokens_per_s:
            base = ran[0] if ran else None
        if base is None:
            return Proposal(config, why, trial_s=self.times.trial_s(config, None))
        parent = self._measured(base)
        keys = options_moved(parent.config, config)
        guess, step, seconds = self._estimate(parent, config, keys, history)
        return Proposal(config, why, parent.config, keys, guess.mean, guess.sd, step, seconds)

    def _estimate(self, parent: Parent, child: TuneConfig, keys: tuple[str, ...],
                  history: History) -> tuple[Estimate, float | None, float]:
        """The child's throughput, step time and trial time, predicted from the parent, or
        from a measured configuration a move or two from the child where that prediction is
        surer (NEIGHBOUR_MOVES)."""
        guess = self._predict(parent, child, keys)
        for r in history.all():
            if not speed_known(r) or r.loss_ok is False or r.tune_config == parent.config:
                continue
            moved = options_moved(r.tune_config, child)
            if len(moved) <= NEIGHBOUR_MOVES:
                near = self._predict(self._measured(r), child, moved)
                if near.sd < guess.sd:
                    guess = near
        step = self._step_s(parent, child, guess.mean - parent.mean)
        return guess, step, self._trial_s(child, step, history)

    def _trial_s(self, config: TuneConfig, step_s: float | None, history: History,
                 cached: bool = False) -> float:
        seconds = self.times.trial_s(config, step_s, cached=cached)
        if not computes_reference(config) and not self.reference_ready(config):
            base = history.get(self.space.start())
            fp32_step = ((base.step_ms or 0) / 1e3 * self._batch(config) / self._batch(base.tune_config)
                         if base is not None and base.step_ms else None)
            seconds += self.times.reference_s(fp32_step)
        return seconds

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
                guess, step, seconds = self._estimate(parent, child, keys, history)
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
                fit_s = self._trial_s(child, step, history, cached=True)
                if available is not None and check_s and seconds + check_s > available \
                        and numerics_class(dict(child.values)) not in verified:
                    late += 1
                    continue
                if check_s:
                    seconds += normal_cdf((guess.mean - best_log) / max(guess.sd, 1e-3)) * check_s
                gain = (expected_improvement(guess.mean, guess.sd, best_log)
                        if best_log is not None else math.exp(guess.mean - 20))
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


def measured_peak_of(history: History, config: TuneConfig) -> int | None:
    found = history.get(config)
    return measured_peak(found) if found is not None else None


__all__ = ["AnytimeSearch", "Proposal", "SearchStrategy"]

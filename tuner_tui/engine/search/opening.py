"""The search's opening, right after the baseline: the recipe an expert would write for this
machine and model (`expert.py`), measured without torch.compile first (an answer in seconds that
a slow or failed compile cannot take away), then that eager recipe with each of a few of its
decisions changed (scouts: an eager trial costs seconds, a compiled one a compile), then the
compiled recipe with each change that ran faster. Torch-free.
"""

from __future__ import annotations

import math
from typing import Callable

from strategies.config import TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.noise import spread, tie_gap
from tuner_tui.engine.search.expert import expert_recipe, variant
from tuner_tui.engine.search.fit import Footprint
from tuner_tui.engine.search.history import History
from tuner_tui.engine.search.moves import SingleMoves, accumulated, options_moved, show
from tuner_tui.engine.search.prediction import Predictor
from tuner_tui.engine.search.priors import FAILED, Context, move_prior
from tuner_tui.engine.search.proposal import Parent, Proposal, expected_improvement
from tuner_tui.engine.search.space import SearchSpace

CHECK_SHARE = 0.1
"""The expert's recipe grows the batch only where checking its loss there (an fp32 reference
run at that batch) takes at most this share of the time left."""
SCOUTED = ("batch_size", "weights", "fp8")
"""Between the expert's eager recipe and its compiled one, each of these changed in the fastest
eager run so far (`Opening._base`), once (an eager trial costs seconds, a compiled one a
compile): the compiled recipe takes each change that ran faster. The expert keeps the run's
batch where checking the loss at a larger one would cost much (an fp32 reference of a model of a
billion parameters), and bf16 weights pay on some large models, not on others. 1000 simulated
searches at five minutes, paired: the batch 5.06% -> 4.77% (-0.29% +- 0.06; a billion parameters
and more -0.89%), the weights after it 4.62% (-0.14% +- 0.06); on 1000 other oracles -0.35% +-
0.07 and -0.10% +- 0.06. The optimizer's state, scouted too, did not pay (+0.13%). Float8 is
scouted otherwise: where the compiled recipe has it, the eager recipe runs with it to see that
it runs here and keeps the loss (a float8 that fails, fails in seconds eager rather than after a
compile of minutes); where it failed, the compiled recipe goes without it. 5.17% -> 5.04%
(-0.13% +- 0.07 paired; a billion parameters and more -0.41% +- 0.21), on 1000 other oracles
4.86% -> 4.79% (-0.07% +- 0.04; -0.23% +- 0.13). Taking float8 by its eager speed as well (its
prior under compile moved by what eager measured beyond its eager prior) did no better on the
other oracles."""


class Opening:
    """One search's opening. `time_available()` says how many seconds a trial may still take
    (None: no limit); `reference_check_s(config)` what checking its loss will take should it
    become the best."""

    def __init__(self, space: SearchSpace, ctx: Context, predictor: Predictor,
                 budget_bytes: int | None, time_available: Callable[[], float | None],
                 reference_check_s: Callable[[TuneConfig], float]) -> None:
        self.space = space
        self.ctx = ctx
        self.predictor = predictor
        self.budget_bytes = budget_bytes
        self.time_available = time_available
        self.reference_check_s = reference_check_s
        self._moves = SingleMoves(space)
        self.footprint: Footprint | None = None
        self.expert: TuneConfig | None = None
        self.pending = False
        """The expert's compiled recipe is still to come after its eager version."""
        self.eager: TuneConfig | None = None
        """The expert's recipe without compile, where it runs first."""
        self.scouts: dict[TuneConfig, TuneConfig] = {}
        """The eager runs with one of SCOUTED changed, as they ran, each with its base: the
        fastest eager run before it (`_base`)."""
        self.scouted = 0
        """How many of SCOUTED were considered."""

    def next(self, history: History, footprint: Footprint) -> Proposal | None:
        """The opening's next trial, or None once it has proposed its last."""
        self.footprint = footprint
        if self.expert is None:
            self.expert = self._recipe(history)
            first = self._eager_first(history)
            if first is not None:
                return first
            if self.expert not in history:
                return self.predictor.from_start(self.expert, "the expert's recipe", history)
        if self.expert not in history and self.pending:
            scout = self._scout(history)
            if scout is not None:
                return scout
            self.pending = False
            self.expert = self._compiled(history)
            expert = self.predictor.from_start(self.expert, "the expert's recipe", history)
            available = self.time_available()
            if available is None or expert.trial_s <= available:
                return expert
            # Where its scope's compile no longer fits the time left, the other scope's may (a
            # model of 83 shapes: 93 s whole, 41 s per block, 61 s left after a scout).
            other = self._other_scope(self.expert)
            if other is not None:
                expert = self.predictor.from_start(other, "the expert's recipe", history)
                if expert.trial_s <= available:
                    self.expert = other
                    return expert
        return None

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
        eager = self._recipe(history, eager=True)
        if eager in history or eager == self.expert:
            return None
        self.pending = True
        self.eager = eager
        available = self.time_available()
        left = f", of the {available:.0f} s left" if available is not None else ""
        return self.predictor.from_start(
            eager, f"the expert's recipe without compile, first (compiling it would take about "
                   f"{self._compile_quote(history)}{left})", history)

    def _compile_quote(self, history: History) -> str:
        """The compiled recipe's trial time, at each scope it may run at: which one is chosen
        after the eager recipe has run (`_scoped`)."""
        scoped = [variant(self.space, self.expert, compile_scope=scope)
                  for scope in ("model", "block")] \
            if "compile_scope" in dict(self.space.choices) else []
        if not scoped or not all(c is not None and self.space.contains(c) for c in scoped):
            return f"{self.predictor.from_start(self.expert, '', history).trial_s:.0f} s"
        whole, block = (self.predictor.from_start(c, "", history).trial_s for c in scoped)
        return f"{whole:.0f} s whole or {block:.0f} s per block"

    def _scout(self, history: History) -> Proposal | None:
        """Between the two recipes, the eager one with one of SCOUTED changed, each once,
        where it likely fits the budget and leaves the compiled recipe its time."""
        ran = history.get(self.eager) if self.eager is not None else None
        if ran is None or ran.status != "ok" or not ran.tokens_per_s:
            return None
        while self.scouted < len(SCOUTED):
            key = SCOUTED[self.scouted]
            self.scouted += 1
            base = self._base(history)
            ran = history.get(base)
            child = self._scout_child(key, base)
            if child is None or child in history or self.footprint.chance_to_fit(child) < 0.5:
                continue
            moved = options_moved(base, child)
            parent = self.predictor.measured(ran)
            guess, step, seconds = self.predictor.estimate(parent, child, moved, history)
            available = self.time_available()
            compiled = self.predictor.from_start(self._compiled(history), "", history)
            if available is not None and seconds + compiled.trial_s > available:
                self.scouted = len(SCOUTED)
                return None
            self.scouts[child] = base
            why = (f"batch {self.predictor.batch(base)} -> {self.predictor.batch(child)}"
                   if key == "batch_size" else
                   ", ".join(f"{k} {show(base, k)} -> {show(child, k)}" for k in moved))
            return Proposal(child, f"the eager recipe with {why}, to tell the compiled one",
                            base, moved, guess.mean, guess.sd, step, seconds)
        return None

    def _base(self, history: History) -> TuneConfig:
        """What the next scout changes: the eager recipe with the earlier scouts' changes that
        ran faster (the fastest eager run so far), so that each decision is judged where the
        compiled recipe will run. Judged at the eager recipe's own batch, GPT-2's bf16 weights
        lost to torchao's step (one call per tensor: 40.8 ms a step at batch 16 on an H100,
        the host's calls outlasting the GPU's work; 2.1-2.4 ms at batch 64 and more), and the
        compiled recipe, at a larger batch, went without them."""
        base, best = self.eager, history.get(self.eager).tokens_per_s
        for scout in self.scouts:
            ran = history.get(scout)
            if ran is not None and ran.status == "ok" and (ran.tokens_per_s or 0) > best:
                base, best = scout, ran.tokens_per_s
        return base

    def _scout_child(self, key: str, eager: TuneConfig) -> TuneConfig | None:
        """`eager` (the scouts' base) with `key` changed: the batch doubled with its
        micro-batch (more micro-batches accumulated would not change the kernels' shapes);
        float8 as the compiled recipe has it (None where it has none); another option to its
        other value, with the options it interacts with at the values their priors expect the
        most of (fp32 weights with fused AdamW)."""
        if key == "fp8":  # the compiled recipe's float8, run eager: does it work here?
            if self.expert.fp8 == "off" or eager.fp8 != "off":
                return None
            return variant(self.space, eager, fp8=self.expert.fp8)
        if key == "batch_size":
            child = next((c for c in self._moves.batch_moves(eager)
                          if self.predictor.batch(c) > self.predictor.batch(eager)), None)
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
        for scout, base in self.scouts.items():
            eager = history.get(base)
            ran = history.get(scout)
            moved = options_moved(base, scout)
            if ran is not None and ran.status in FAILED:  # (float8 that does not run here)
                config = variant(self.space, config, **{k: base[k] for k in moved}) \
                    or config
                continue
            if ran is None or ran.status != "ok" or not ran.tokens_per_s or eager is None:
                continue
            changed = variant(self.space, config, **{k: scout[k] for k in moved})
            if changed is None or self.footprint.chance_to_fit(changed) < 0.5:
                continue
            gain = math.log(ran.tokens_per_s / eager.tokens_per_s)
            if abs(gain) <= tie_gap(spread(ran) or 0.0, spread(eager) or 0.0):
                at = Parent(config, 0.0, 0.0, None, False)
                gain = self.predictor.predict(at, changed, moved).mean
            if gain > 0:
                config = changed
        return config

    def _compiled(self, history: History) -> TuneConfig:
        """The compiled recipe as it will run: with what the scouts taught, at its scope."""
        return self._scoped(self._scouted(history), history)

    def _scoped(self, config: TuneConfig, history: History) -> TuneConfig:
        """The compiled recipe compiled whole or per block, whichever expects more gain per
        second of its trial: per block compiles in a fraction of the time (a quarter on the
        H200's transformers), so on a large model, where one whole compile takes minutes of a
        five-minute search, it leaves time for the moves after it, at a cost its prior weighs
        (`compile_scope` in the registry). The other scope is predicted from the recipe's own
        prediction by that prior alone."""
        other = self._other_scope(config)
        guess = self.predictor.from_start(config, "", history) if other is not None else None
        if other is None or guess.mean is None:
            return config
        at = Parent(config, guess.mean, guess.sd, guess.step_s, False)
        moved = self.predictor.predict(at, other, ("compile_scope",))
        step = self.predictor.step_s(at, other, moved.mean - guess.mean)
        best = history.best()

        def per_second(candidate: TuneConfig, mean: float, sd: float, seconds: float) -> float:
            if best is None:  # nothing to beat yet: the sooner the better
                return 1.0 / seconds
            gain = expected_improvement(mean, sd, math.log(best.tokens_per_s))
            return (gain * self.predictor.priors.chance_it_works(candidate)
                    * self.footprint.chance_to_fit(candidate) / seconds)

        if per_second(other, moved.mean, moved.sd, self.predictor.trial_s(other, step, history)) \
                > per_second(config, guess.mean, guess.sd, guess.trial_s):
            return other
        return config

    def _other_scope(self, config: TuneConfig) -> TuneConfig | None:
        """The compiled `config` at the other compile scope, where the space searches scopes."""
        if config.compile_mode == "off" or "compile_scope" not in dict(self.space.choices):
            return None
        other = variant(self.space, config, compile_scope="block" if
                        config.compile_scope == "model" else "model")
        return other if other is not None and self.space.contains(other) else None

    def _recipe(self, history: History, eager: bool = False) -> TuneConfig:
        """The expert's recipe; at the run's batch where checking the loss at the larger batch
        it would grow to would take more than CHECK_SHARE of the time left (an fp32 reference
        at four times the batch of a billion-parameter model: a quarter of five minutes)."""
        grown = expert_recipe(self.space, self.ctx, self.footprint, self.budget_bytes, eager=eager)
        available = self.time_available()
        if available is None or self.reference_check_s(grown) <= CHECK_SHARE * available:
            return grown
        return expert_recipe(self.space, self.ctx, self.footprint, self.budget_bytes,
                             eager=eager, grow_batch=False)

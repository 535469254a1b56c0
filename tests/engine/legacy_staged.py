"""The staged search as `gputune tune` ran it until 2026-12-02 (tuner_tui/engine/search/staged.py
then), kept unchanged but for its imports as the baseline the simulated searches compare the
anytime search against (tests/engine/test_search_simulated.py): its own history class and its
greedy stages in a fixed order. Torch-free."""

from __future__ import annotations

import itertools

from strategies.config import ConfigError, TuneConfig
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.runner import best
from tuner_tui.engine.search.memory import measured_peak
from tuner_tui.engine.search.space import PARALLEL_KNOBS, SearchSpace
from tuner_tui.engine.store import canonical_json


class History:
    """Every trial of one search, in the order they were decided, keyed by configuration."""

    def __init__(self, space: SearchSpace, budget_bytes: int | None = None) -> None:
        self.space = space
        self.budget_bytes = budget_bytes
        self.results: dict[str, TrialResult] = {}
        self.aside: set[str] = set()
        """Keys of trials measured only to be compared with (`--compare`): ranked and
        recommendable, but they steer the stages only once a stage reaches them (`adopt`).
        Otherwise a compiled configuration measured first would make every early stage
        compile, and the search would spend its minutes compiling configurations that the
        eager stages rule out in seconds."""

    def __contains__(self, config: TuneConfig) -> bool:
        return config_key(config) in self.results

    def get(self, config: TuneConfig) -> TrialResult | None:
        return self.results.get(config_key(config))

    def add(self, config: TuneConfig, result: TrialResult, aside: bool = False) -> None:
        key = config_key(config)
        self.results[key] = result
        if aside:
            self.aside.add(key)

    def is_aside(self, config: TuneConfig) -> bool:
        return config_key(config) in self.aside

    def adopt(self, config: TuneConfig) -> None:
        """A stage reached a configuration measured aside: it counts as searched from now on."""
        self.aside.discard(config_key(config))

    def is_new(self, config: TuneConfig) -> bool:
        """Still to be proposed by the stages: not measured, or measured aside only."""
        return config not in self or self.is_aside(config)

    def all(self) -> list[TrialResult]:
        return list(self.results.values())

    def eligible(self) -> list[TrialResult]:
        """Trials that may be recommended: ran, kept the loss, lie in the space, and stayed
        within the memory budget (a stored trial may come from a search with a larger one)."""
        return [
            r for r in self.results.values()
            if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False
            and self.space.contains(r.tune_config)
            and (self.budget_bytes is None or (measured_peak(r) or 0) <= self.budget_bytes)
        ]

    def best(self) -> TrialResult | None:
        return best(self.eligible())

    def steering_best(self) -> TrialResult | None:
        """The best of the trials the stages reached (the incumbent), leaving out those
        measured aside."""
        aside = {id(self.results[k]) for k in self.aside}
        return best([r for r in self.eligible() if id(r) not in aside])

    def fits(self, result: TrialResult) -> bool:
        """False when the trial ran out of memory, was skipped as over the memory budget, or
        measured a peak over it; other failures are not a matter of memory."""
        if result.status in ("oom", "skipped"):
            return False
        peak = measured_peak(result)
        return self.budget_bytes is None or peak is None or peak <= self.budget_bytes


def config_key(config: TuneConfig) -> str:
    return canonical_json(config.to_dict())


class SearchStrategy:
    """Proposes the configurations to measure, a round at a time, from the results so far.

    A new strategy is one subclass: `propose` returns the next round ([] when done), and
    `remaining` estimates how many trials are still to come (for the progress line)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def propose(self, history: History) -> list[TuneConfig]:
        raise NotImplementedError

    def remaining(self, history: History) -> int:
        return 0

    def must_run(self, config: TuneConfig) -> bool:
        """True for a configuration that must be measured even where the memory estimate says
        it will not fit (the estimate may rest on what this one is to measure)."""
        return False


class StagedSearch(SearchStrategy):
    """Greedy in stages from the fp32 eager baseline: each stage varies one option, or a few that
    interact, around the best configuration so far. Memory first where it is short: when the
    baseline does not fit the budget, the search walks a ladder of memory levers, cheapest in
    speed first, down to the configuration that needs the least memory (`fit_ladder`), and
    climbs in speed from the first that fits. The memory stage turns memory into
    speed: per micro-batch size, from the whole batch down, the cheapest checkpointing mode that
    fits, and smaller micro-batches only where the larger ones do not fit without
    checkpointing. Kernels are tried together with compile (they can fight: a fused kernel is
    opaque to Inductor's own fusion)."""

    FIT_STAGE = "fit: the cheapest memory levers first, where the baseline does not fit"
    MEMORY_STAGE = "micro-batch, checkpointing where memory runs out"
    PARALLEL_STAGE = "data parallel: DDP or FSDP2, and their knobs"
    STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("baseline", ()),
        (FIT_STAGE, ()),
        # Right after a fit-first start: the floor's micro-batch of 1 and full checkpointing
        # are slow, and every later stage compares its candidates at the incumbent's.
        (MEMORY_STAGE, ("batch_size", "micro_batch_size", "checkpointing")),
        ("precision", ("precision", "weights")),
        # The optimizer's state next: after a fit-first start it holds the most memory that
        # speed can buy back (8-bit state is slower than bf16 or fp32), and eager trials are cheap.
        ("optimizer", ("optimizer", "optimizer_state")),
        ("attention", ("attention",)),
        # DDP against FSDP2 on the eager configuration at its fastest (eager trials are cheap,
        # and compile comes next around the winner); the memory stage after compile then uses
        # what sharding freed.
        (PARALLEL_STAGE, ("parallel", *PARALLEL_KNOBS)),
        ("compile", ("compile_mode", "compile_scope")),
        # Memory before kernels: the batch the device holds at once moves throughput more than
        # any kernel (ANCHORS.md), so a search cut short by its time budget loses the smaller
        # lever.
        (MEMORY_STAGE, ("batch_size", "micro_batch_size", "checkpointing")),
        ("kernels x compile", ("compile_mode", "fused_kernels")),
        ("fp8", ("fp8",)),
        # Once more: the fused loss and fp8 free memory that a larger micro-batch may use.
        (MEMORY_STAGE, ("batch_size", "micro_batch_size", "checkpointing")),
    )
    ROUNDS_UNTIL_DONE = (FIT_STAGE, MEMORY_STAGE, PARALLEL_STAGE)
    """Stages that go on, a round at a time, until they propose nothing new."""
    CHECKPOINT_COST = ("off", "selective", "every-n", "full")
    """Checkpointing modes from the least recomputation to the most."""
    ADDRESSES = {
        "host": {"compile", MEMORY_STAGE, "optimizer"},
        "memory": {"kernels x compile", "compile", "optimizer"},
        "compute": {"precision", "attention", "fp8"},
        "communication": {PARALLEL_STAGE},
    }
    """The stages that address each bottleneck of a profile (`engine/profile.py`). With profiles
    (tune --profile), the stages still to come that address the best's bottleneck go first,
    each in its usual order."""

    def __init__(self, space: SearchSpace) -> None:
        super().__init__(space)
        self.stage = 0
        """How many stages are done (or under way); `order[stage]` is the next."""
        self.order = list(range(len(self.STAGES)))
        self._ordered_at = -1
        self.round: list[TuneConfig] = []
        self.round_stage = self.STAGES[0][0]

    def candidates(self, stage: int, history: History) -> list[TuneConfig]:
        name, keys = self.STAGES[stage]
        incumbent = self._incumbent(history)
        if name == self.FIT_STAGE:
            return self._fit_candidates(history)
        if name == self.MEMORY_STAGE:
            return self._memory_candidates(incumbent, history)
        if name == self.PARALLEL_STAGE:
            return self._parallel_candidates(incumbent, history)
        axes = []
        for key in keys:
            values = list(self.space.values(key))
            if key == "compile_mode" and "fused_kernels" in keys:
                # Kernels with the compile mode that won first (the likelier winner, should the
                # time budget end the stage), then in eager (kernels alone): not every mode.
                values = [v for v in values if v == incumbent.compile_mode] + (
                    ["off"] if incumbent.compile_mode != "off" and "off" in values else [])
            axes.append(values)
        found: list[TuneConfig] = []
        for combo in itertools.product(*axes):
            config = self._variant(incumbent, dict(zip(keys, combo)))
            if config is not None and history.is_new(config) and config not in found:
                found.append(config)
        if "fused_kernels" in keys:
            # Compiled before eager; with each, kernels before none.
            found.sort(key=lambda c: (c.compile_mode == "off", not c.fused_kernels))
        return found

    def fit_ladder(self) -> list[TuneConfig]:
        """Where the baseline does not fit: configurations to try in turn until one fits, from
        the levers that cost the least speed to the least memory. On several devices, FSDP2
        first (sharding divides parameters, gradients and optimizer state by the devices at
        about DDP's speed), and with every rung after it. Then bf16 weights and bf16
        optimizer state with SDPA and the fused linear + cross-entropy (on a large model often
        faster than the baseline, not slower); then selective checkpointing; 8-bit state; full
        checkpointing; and the floors (`floors`). A rung whose estimate is clearly over the
        budget is skipped without a trial, so the ladder costs trials only near the budget."""
        values = self.space.values
        common = self._lean_changes()
        rungs = [self._sharding()] if self._sharding() else []
        rungs.append(dict(common, optimizer_state="bf16")
                     if "bf16" in values("optimizer_state") else dict(common))
        if "selective" in values("checkpointing"):
            rungs.append(dict(rungs[-1], checkpointing="selective"))
        if "8bit" in values("optimizer_state"):
            rungs.append(dict(rungs[-1], optimizer_state="8bit"))
        if "full" in values("checkpointing"):
            rungs.append(dict(rungs[-1], checkpointing="full"))
        found: list[TuneConfig] = []
        for changes in rungs:
            config = self._variant(self.space.start(), changes)
            if config is not None and config not in found:
                found.append(config)
        return found + [f for f in self.floors() if f not in found]

    def _sharding(self) -> dict:
        """FSDP2 where the space has it and there are devices to shard over."""
        if self.space.devices > 1 and "fsdp2" in self.space.values("parallel"):
            return {"parallel": "fsdp2"}
        return {}

    def _lean_changes(self) -> dict:
        """FSDP2 on several devices, bf16 weights (bf16 precision), SDPA and the fused linear
        + cross-entropy, where the space has them: what saves memory without costing speed."""
        values = self.space.values
        changes: dict = dict(self._sharding())
        if "bf16" in values("weights") and "bf16" in values("precision"):
            changes.update(weights="bf16", precision="bf16")
        if "sdpa" in values("attention"):
            changes["attention"] = "sdpa"
        with_loss = [k for k in values("fused_kernels") if "linear_cross_entropy" in k]
        if with_loss:
            changes["fused_kernels"] = max(with_loss, key=len)
        return changes

    def floors(self) -> list[TuneConfig]:
        """The configurations of the space that need the least memory, in the order to try them:
        the lean changes (`_lean_changes`), full checkpointing, a micro-batch of 1, and 8-bit
        optimizer state (then state offloaded to the host)."""
        values = self.space.values
        changes = self._lean_changes()
        if "full" in values("checkpointing"):
            changes["checkpointing"] = "full"
        if 1 in self.space.micro_batches(self.space.start()):
            changes["micro_batch_size"] = 1
        states = [s for s in ("8bit", "offload", "bf16") if s in values("optimizer_state")]
        found = []
        for state in states or [None]:
            extra = {"optimizer_state": state} if state else {}
            config = self._variant(self.space.start(), {**changes, **extra})
            if config is not None and config not in found:
                found.append(config)
        return found

    def must_run(self, config: TuneConfig) -> bool:
        """The floors: they measure what the least memory is."""
        return config in self.floors()

    def _fit_candidates(self, history: History) -> list[TuneConfig]:
        """Where the baseline does not fit (out of memory, or measured or estimated over the
        budget) and nothing else has: the next rung of the fit ladder not yet tried, until one
        fits."""
        baseline = history.get(self.space.start())
        if baseline is None or history.fits(baseline) or history.steering_best() is not None:
            return []
        for rung in self.fit_ladder():
            result = history.get(rung)
            if result is None or history.is_aside(rung):
                return [rung]
            if history.fits(result):
                return []
        return []

    def _memory_candidates(self, incumbent: TuneConfig, history: History) -> list[TuneConfig]:
        """Per batch size and micro-batch size (the whole batch first), the next checkpointing
        mode to try: none first, then, only while it does not fit (out of memory, or over the
        budget by estimate or measurement), the next mode by cost. Checkpointing recomputes
        activations and accumulation splits the work into smaller launches, so where a larger
        micro-batch fits without checkpointing, neither can make the step faster: the smaller
        micro-batches are tried only where the larger one does not fit (or not yet known)."""
        modes = sorted(self.space.values("checkpointing"), key=self._cost)
        found: list[TuneConfig] = []
        for batch in self._batch_sizes(history):
            sized = self._variant(incumbent, {"batch_size": batch})
            for micro in self.space.micro_batches(sized or incumbent):
                settled = None  # the first mode that fits or is still to be measured
                for mode in modes:
                    config = self._variant(incumbent, {"batch_size": batch,
                                                       "micro_batch_size": micro,
                                                       "checkpointing": mode})
                    if config is None:
                        continue
                    result = history.get(config)
                    if result is None or history.is_aside(config):
                        if config not in found:
                            found.append(config)
                        settled = mode
                        break
                    if history.fits(result):
                        settled = mode
                        break
                if settled == modes[0]:
                    break
        return found

    def _parallel_candidates(self, incumbent: TuneConfig, history: History) -> list[TuneConfig]:
        """Each data parallel mode of the space around the incumbent, FSDP2 with each of its
        resharding choices; once those are measured, the knobs of the incumbent's mode around
        it (DDP's bucket size and bucket views, FSDP2's reduce dtype): they move less, and cost
        a trial each."""
        values = self.space.values
        first: list[TuneConfig] = []
        for mode in values("parallel"):
            knobs = [{}] + ([{"fsdp_reshard": v} for v in values("fsdp_reshard")]
                            if mode == "fsdp2" else [])
            for changes in knobs:
                config = self._variant(incumbent, {"parallel": mode, **changes})
                if config is not None and history.is_new(config) and config not in first:
                    first.append(config)
        if first:
            return first
        found: list[TuneConfig] = []
        for knob in (k for k, mode in PARALLEL_KNOBS.items() if mode == incumbent.parallel):
            for value in values(knob):
                config = self._variant(incumbent, {knob: value})
                if config is not None and history.is_new(config) and config not in found:
                    found.append(config)
        return found

    GROW_MIN_GAIN = 0.02
    """A larger batch is tried only while the largest so far beat the smaller ones by this."""
    GROW_MAX_DOUBLINGS = 3

    def _batch_sizes(self, history: History) -> list[int]:
        """The space's batch sizes, then doublings of the largest while the largest is the best
        configuration so far and beat the best smaller batch by GROW_MIN_GAIN: on a large GPU
        the fastest batch may lie beyond the default candidates (memory, not a fixed list,
        should end the climb; OOM and the budget estimate do)."""
        batches = list(self.space.values("batch_size"))
        if not self.space.grow_batch or not any(batches):
            return batches
        best = history.steering_best()
        for _ in range(self.GROW_MAX_DOUBLINGS):
            largest = max(batches)
            if best is None or best.config["batch_size"] < largest:
                break
            if best.config["batch_size"] == largest:
                smaller = [r.tokens_per_s for r in history.eligible()
                           if r.config["batch_size"] != largest]
                if smaller and best.tokens_per_s < max(smaller) * (1 + self.GROW_MIN_GAIN):
                    break
            batches.append(largest * 2)  # (already measured when the best lies beyond)
        return batches

    def _cost(self, mode: str) -> int:
        return self.CHECKPOINT_COST.index(mode) if mode in self.CHECKPOINT_COST else len(
            self.CHECKPOINT_COST)

    def _variant(self, incumbent: TuneConfig, changes: dict) -> TuneConfig | None:
        try:
            return self.space.canonical(incumbent.replace(**changes))
        except ConfigError:
            return None  # a combination the registry's rules refuse

    def _incumbent(self, history: History) -> TuneConfig:
        best = history.steering_best()
        return best.tune_config if best else self.space.start()

    def _follow_bottleneck(self, history: History) -> None:
        best = history.steering_best()
        first = self.ADDRESSES.get((best.profile or {}).get("bottleneck"), set()) if best else set()
        rest = self.order[self.stage:]
        rest.sort(key=lambda s: self.STAGES[s][0] not in first)  # stable: the usual order within
        self.order[self.stage:] = rest

    def propose(self, history: History) -> list[TuneConfig]:
        while self.stage < len(self.STAGES):
            if self._ordered_at != self.stage:  # a new stage begins: the best may have changed
                self._follow_bottleneck(history)
                self._ordered_at = self.stage
            found = self.candidates(self.order[self.stage], history)
            reached = [c for c in found if history.is_aside(c)]
            if reached:
                # Measured aside already: adopted without a re-run; the incumbent may change,
                # so the stage's candidates are computed again.
                for config in reached:
                    history.adopt(config)
                continue
            name = self.STAGES[self.order[self.stage]][0]
            # The fit and memory stages go on (one floor, or one checkpointing mode further, per
            # round) until they propose nothing new; the others take one round.
            if not found or name not in self.ROUNDS_UNTIL_DONE:
                self.stage += 1
            if found:
                self.round, self.round_stage = found, name
                return found
        return []

    def remaining(self, history: History) -> int:
        """Later stages' candidates around the best so far (they move as the best changes)."""
        later = {config_key(c) for s in self.order[self.stage:]
                 for c in self.candidates(s, history)}
        return len(later - {config_key(c) for c in self.round})

    def stage_name(self) -> str:
        return self.round_stage

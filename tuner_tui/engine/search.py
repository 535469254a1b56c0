"""`gputune tune`: search the configurations for the fastest one that keeps the loss.

The search runs in the parent process, which imports no torch. Every trial runs in a fresh worker
process through bench's helpers, so a trial that runs out of memory, diverges, fails to compile
or kills its process is marked and the search goes on. Around the trials:

- the space: precision x attention x compile mode/scope x optimizer x fused kernels x
  checkpointing x batch size, each option restricted to what this machine can run;
- a strategy (`SearchStrategy`) proposes configurations in rounds from the results so far; the
  default, `StagedSearch`, is greedy in stages and tries together the options that interact;
- a memory budget: a trial whose estimated peak (`estimate_peak`) exceeds it is skipped before
  it runs; a time budget: no trial starts after it;
- early stop: a trial clearly slower than the best so far is stopped after a few measured steps;
- the result store: a trial measured before on this machine is reused, not run again;
- one Inductor cache directory under the gputune home shared by every trial;
- a correctness gate: only a trial that ran (`ok`) and kept the fp32 reference's loss can be
  recommended.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from strategies.config import ConfigError, ExportedConfig, TuneConfig, parse_value, save
from strategies.registry import OPTIONS, Capabilities, option_unavailable
from tuner_tui.engine import bench
from tuner_tui.engine.client import WorkerSpec
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.store import ResultStore, canonical_json, gputune_home

# -- the space ------------------------------------------------------------------------------------

KERNEL_SETS = (
    (),
    ("layer_norm", "rms_norm", "gelu", "swiglu"),
    ("layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"),
)
"""Fused-kernel sets tried by default: none, the element-wise ones, and those plus the fused
linear + cross-entropy (which saves the most memory). A kernel whose module the model lacks is
simply not swapped."""

DEFAULT_CHOICES: dict[str, tuple] = {
    "precision": ("fp32", "tf32", "bf16", "fp16"),
    "attention": ("manual", "sdpa"),
    # The max-autotune modes are left out by default: their autotuning takes minutes per trial.
    # Ask for them with --search compile_mode=off,default,max-autotune.
    "compile_mode": ("off", "default", "reduce-overhead"),
    "compile_scope": ("model", "block"),
    "optimizer": ("plain", "foreach", "fused"),
    "fused_kernels": KERNEL_SETS,
    "checkpointing": ("off", "selective", "every-n", "full"),
    # Multiples of the workload's default batch size (resolved when the workload is known).
    "batch_size": ("x1", "x2", "x4"),
}

REUSABLE = ("ok", "oom", "diverged", "compile", "invalid", "loss-mismatch", "stopped")
"""Statuses of stored trials that a later search reuses. A crash (a dead process, a timeout) may
not happen again, so it is measured again."""

LOSS_CHECK_STEPS = bench.LOSS_CHECK_STEPS


@dataclass(frozen=True)
class SearchSpace:
    """The candidate values of each searched option; every other option is fixed."""

    choices: tuple[tuple[str, tuple], ...]
    fixed: tuple[tuple[str, Any], ...] = ()
    grow_batch: bool = False
    """Try batch sizes beyond the largest candidate while they keep paying (the default batch
    choices only: batch sizes the user listed are taken as the whole set)."""

    def values(self, key: str) -> tuple:
        found = dict(self.choices).get(key)
        if found is not None:
            return found
        return (dict(self.fixed).get(key, _default(key)),)

    def start(self) -> TuneConfig:
        """The first configuration: every option at its default when that is a candidate (the
        fp32 eager baseline), else at its first candidate."""
        values = dict(self.fixed)
        for key, candidates in self.choices:
            default = _default(key)
            values[key] = default if default in candidates else candidates[0]
        return self.canonical(TuneConfig.from_dict(values))

    def canonical(self, config: TuneConfig) -> TuneConfig:
        """One configuration per distinct run: options that do nothing in it (compile scope
        without compile, checkpoint_every without every-n) are put back at their start value,
        and under compile the fused kernels left to Inductor are dropped
        (`TuneConfig.effective_kernels`): a set that differs only in those is the same run."""
        fixed = dict(self.fixed)
        changes = {}
        effective = config.effective_kernels()
        if effective != tuple(config.fused_kernels):
            changes["fused_kernels"] = list(effective)
        if config.compile_mode == "off":
            changes["compile_scope"] = fixed.get("compile_scope", _default("compile_scope"))
            changes["compile_fullgraph"] = False
        if config.checkpointing != "every-n":
            changes["checkpoint_every"] = fixed.get(
                "checkpoint_every", _default("checkpoint_every")
            )
        return config.replace(**changes)

    def contains(self, config: TuneConfig) -> bool:
        canonical = self.canonical(config)
        return canonical == config and all(
            self._listed(key, config) or self._grown(key, config[key])
            for key in OPTIONS
            if key not in ("compile_scope", "compile_fullgraph", "checkpoint_every")
        ) and (config.compile_mode == "off" or config.compile_scope in self.values("compile_scope"))

    def _listed(self, key: str, config: TuneConfig) -> bool:
        """The option's value is one of the space's, as `canonical` would put it."""
        values = self.values(key)
        if key == "fused_kernels":
            values = [self.canonical(config.replace(fused_kernels=v)).fused_kernels for v in values]
        return _plain(config[key]) in [_plain(v) for v in values]

    def _grown(self, key: str, value: Any) -> bool:
        """A batch size that the search may reach by doubling the largest candidate."""
        if key != "batch_size" or not self.grow_batch:
            return False
        top = max(self.values("batch_size"))
        ratio = value / top if top else 0
        return ratio > 1 and ratio.is_integer() and (int(ratio) & (int(ratio) - 1)) == 0

    def size(self) -> int:
        return math.prod(len(v) for _, v in self.choices)

    def describe(self) -> str:
        parts = []
        for key, values in self.choices:
            shown = [("+".join(v) or "none") if isinstance(v, tuple) else str(v) for v in values]
            parts.append(f"{key}: {', '.join(shown)}")
        return "; ".join(parts)


def _default(key: str) -> Any:
    return OPTIONS[key].default


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def default_space(
    caps: Capabilities,
    default_batch: int,
    fixed: dict | None = None,
    choices: dict | None = None,
) -> SearchSpace:
    """The space for this machine: `DEFAULT_CHOICES`, replaced per option by `choices`, without
    the options that `fixed` sets, and without the values this machine cannot run."""
    fixed = dict(fixed or {})
    merged = {**DEFAULT_CHOICES, **(choices or {})}
    kept: list[tuple[str, tuple]] = []
    for key, values in merged.items():
        if key in fixed:
            continue
        if key == "batch_size":
            values = tuple(_batch_value(v, default_batch) for v in values)
        runnable = []
        for value in values:
            canonical = TuneConfig.from_dict({key: value})[key]
            runs = option_unavailable(OPTIONS[key], canonical, caps) is None
            if runs and canonical not in runnable:
                runnable.append(canonical)
        if not runnable:
            raise ConfigError(
                f"--search {key}: none of its values can run on device = {caps.device}"
            )
        if len(runnable) > 1 or key in (choices or {}):
            kept.append((key, tuple(runnable)))
        else:
            fixed.setdefault(key, runnable[0])
    modes = dict(kept).get("compile_mode", (fixed.get("compile_mode", "off"),))
    if modes == ("off",):  # a compile scope changes nothing without compile
        kept = [(k, v) for k, v in kept if k != "compile_scope"]
    grow = "batch_size" in dict(kept) and "batch_size" not in (choices or {})
    return SearchSpace(tuple(kept), tuple(fixed.items()), grow_batch=grow)


def _batch_value(value: Any, default_batch: int) -> int:
    """`x2` is twice the workload's default; the default itself is 0, as in every config."""
    if isinstance(value, str) and value.startswith("x"):
        value = int(float(value[1:]) * default_batch)
    return 0 if value == default_batch else value


def parse_choices(key: str, text: str) -> tuple:
    """The values of `--search KEY=V1,V2`; set values join their items with '+' (`none` for
    the empty set), e.g. fused_kernels=none,layer_norm+gelu."""
    option = OPTIONS.get(key)
    if option is None:
        raise ConfigError(
            f"--search: unknown option {key!r}: allowed options are " + ", ".join(OPTIONS)
        )
    values = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if option.kind == "set":
            value = () if item == "none" else tuple(t for t in item.split("+") if t)
        elif key == "batch_size" and re.fullmatch(r"x\d+(\.\d+)?", item):
            values.append(item)
            continue
        else:
            value = parse_value(option, item)
        values.append(TuneConfig.from_dict({key: value})[key])  # names the bad value
    if not values:
        raise ConfigError(f"--search {key}= names no values: {option.describe_allowed()}")
    return tuple(values)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'40GiB', '512MiB', '1.5GB', '123456' -> bytes. Raises ValueError with one line."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: a number with an optional unit (B, KB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB), e.g. 40GiB"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r} is not a size above zero")
    return value


def gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


# -- memory ---------------------------------------------------------------------------------------

CHECKPOINT_PRIOR = 1.0
"""Peak per sample of a checkpointed run relative to no checkpointing, until measured: 1.0, so an
unmeasured checkpointing mode is never assumed to fit where no checkpointing would not."""


def measured_peak(result: TrialResult) -> int | None:
    """What counts against the budget: the larger of allocated and reserved peaks."""
    peaks = [p for p in (result.peak_memory_bytes, result.peak_reserved_bytes) if p]
    return max(peaks) if peaks else None


def estimate_peak(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int
) -> int | None:
    """The peak memory `config` would reach, from the trials measured so far: the peak of the
    nearest measured configuration (fewest other options different, then the same checkpointing,
    then the closest batch size), scaled linearly with the batch size and by the measured ratio
    between checkpointing modes. Linear scaling of the whole peak over-estimates larger batches
    (weights and optimizer state do not grow), which errs on the side of not running out of
    memory. None when nothing was measured."""
    known = [(TuneConfig.from_dict(r.config), r) for r in measured if measured_peak(r)]
    if not known:
        return None

    def batch(c: TuneConfig) -> int:
        return c.batch_size or default_batch

    loose = ("batch_size", "checkpointing", "checkpoint_every")

    def others(c: TuneConfig) -> int:
        return sum(c[k] != config[k] for k in OPTIONS if k not in loose)

    def distance(item):
        c, _ = item
        return (others(c), c.checkpointing != config.checkpointing,
                abs(math.log(batch(c) / batch(config))))

    near_config, near = min(known, key=distance)
    per_sample = measured_peak(near) / batch(near_config)
    ratio = _checkpoint_ratio(config.checkpointing, known, batch) / _checkpoint_ratio(
        near_config.checkpointing, known, batch
    )
    return int(per_sample * ratio * batch(config))


def _checkpoint_ratios(mode: str, known, batch) -> list[float]:
    """Peak per sample with `mode` over the same configuration without checkpointing, one per
    measured pair; `known` holds (config, result) pairs with a measured peak."""
    ratios = []
    for c, r in known:
        if c.checkpointing != mode:
            continue
        for c_off, r_off in known:
            if c_off.checkpointing == "off" and c_off.replace(
                batch_size=c.batch_size, checkpointing=mode, checkpoint_every=c.checkpoint_every
            ) == c:
                ratios.append((measured_peak(r) / batch(c)) / (measured_peak(r_off) / batch(c_off)))
    return ratios


def _checkpoint_ratio(mode: str, known, batch) -> float:
    """The median of the measured ratios for `mode`; CHECKPOINT_PRIOR until one is measured."""
    if mode == "off":
        return 1.0
    ratios = _checkpoint_ratios(mode, known, batch)
    return statistics.median(ratios) if ratios else CHECKPOINT_PRIOR


# -- strategies -----------------------------------------------------------------------------------


TRIAL_GRACE_S = 300.0
"""The least time a trial started inside the time budget is given before it is stopped."""


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
            and self.space.contains(TuneConfig.from_dict(r.config))
            and (self.budget_bytes is None or (measured_peak(r) or 0) <= self.budget_bytes)
        ]

    def best(self) -> TrialResult | None:
        return bench.best(self.eligible())

    def steering_best(self) -> TrialResult | None:
        """The best of the trials the stages reached (the incumbent), leaving out those
        measured aside."""
        aside = {id(self.results[k]) for k in self.aside}
        return bench.best([r for r in self.eligible() if id(r) not in aside])

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


class StagedSearch(SearchStrategy):
    """Greedy in stages from the fp32 eager baseline: each stage varies one option, or a few that
    interact, around the best configuration so far. One stage turns memory into speed: it tries
    the larger batch sizes, and checkpointing only where a batch size does not fit without it.
    Kernels are tried together with compile (they can fight: a fused kernel is opaque to
    Inductor's own fusion)."""

    MEMORY_STAGE = "batch size, checkpointing where memory runs out"
    STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("baseline", ()),
        ("precision", ("precision",)),
        ("attention", ("attention",)),
        ("compile", ("compile_mode", "compile_scope")),
        ("optimizer", ("optimizer",)),
        # Batch size before kernels: it moves throughput more than any kernel (ANCHORS.md), so a
        # search cut short by its time budget loses the smaller lever.
        (MEMORY_STAGE, ("batch_size", "checkpointing")),
        ("kernels x compile", ("compile_mode", "fused_kernels")),
    )
    CHECKPOINT_COST = ("off", "selective", "every-n", "full")
    """Checkpointing modes from the least recomputation to the most."""

    def __init__(self, space: SearchSpace) -> None:
        super().__init__(space)
        self.stage = 0
        self.round: list[TuneConfig] = []
        self.round_stage = self.STAGES[0][0]

    def candidates(self, stage: int, history: History) -> list[TuneConfig]:
        name, keys = self.STAGES[stage]
        incumbent = self._incumbent(history)
        if name == self.MEMORY_STAGE:
            return self._memory_candidates(incumbent, history)
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

    def _memory_candidates(self, incumbent: TuneConfig, history: History) -> list[TuneConfig]:
        """Per batch size, the next checkpointing mode to try: none first, then, only while the
        batch does not fit (out of memory, or over the budget by estimate or measurement), the
        next mode by cost. Checkpointing recomputes activations, so where a batch fits without
        it, it can only slow the step; its worth is the larger batch it lets fit."""
        modes = sorted(self.space.values("checkpointing"), key=self._cost)
        found: list[TuneConfig] = []
        for batch in self._batch_sizes(history):
            for mode in modes:
                config = self._variant(incumbent, {"batch_size": batch, "checkpointing": mode})
                if config is None:
                    continue
                result = history.get(config)
                if result is None or history.is_aside(config):
                    if config not in found:
                        found.append(config)
                    break
                if history.fits(result):
                    break
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
        return TuneConfig.from_dict(best.config) if best else self.space.start()

    def propose(self, history: History) -> list[TuneConfig]:
        while self.stage < len(self.STAGES):
            found = self.candidates(self.stage, history)
            reached = [c for c in found if history.is_aside(c)]
            if reached:
                # Measured aside already: adopted without a re-run; the incumbent may change,
                # so the stage's candidates are computed again.
                for config in reached:
                    history.adopt(config)
                continue
            name = self.STAGES[self.stage][0]
            # The memory stage goes on (one checkpointing mode further per round) until every
            # batch size fits or has run out of modes; the others take one round.
            if not found or name != self.MEMORY_STAGE:
                self.stage += 1
            if found:
                self.round, self.round_stage = found, name
                return found
        return []

    def remaining(self, history: History) -> int:
        """Later stages' candidates around the best so far (they move as the best changes)."""
        later = {config_key(c) for s in range(self.stage, len(self.STAGES))
                 for c in self.candidates(s, history)}
        return len(later - {config_key(c) for c in self.round})

    def stage_name(self) -> str:
        return self.round_stage


# -- the search -----------------------------------------------------------------------------------


@dataclass
class SearchPlan:
    spec: WorkerSpec
    steps: int = 20
    warmup_steps: int = 5
    max_memory_bytes: int | None = None
    """None: the GPU's memory, or the available RAM on the CPU."""
    budget_s: float | None = None
    """No trial starts after this many seconds; None: no limit."""
    trial_timeout_s: float = 900.0
    fixed: dict = field(default_factory=dict)
    """Options held at one value (`--set`)."""
    choices: dict = field(default_factory=dict)
    """Candidate values replacing the default ones per option (`--search`)."""
    compare: list = field(default_factory=list)
    """Configurations (TuneConfig) measured first, side by side with the search, such as the
    one the user trains with now; the report gives the recommendation's speed against each."""
    early_stop_ratio: float = 1.5
    """A trial whose throughput after a few steps is below the best's divided by this stops."""
    early_stop_after: int = 3


@dataclass
class SearchOutcome:
    results: list[TrialResult]
    """Every trial decided, in order: measured, reused from the store, skipped."""
    ranked: list[TrialResult]
    """The trials that may be recommended, fastest first (`eligible` of them), then the rest."""
    eligible: int
    front: list[TrialResult]
    recommendation: TrialResult | None
    reason: str
    environment: dict
    workload: dict
    workload_key: str
    space: SearchSpace
    budget_bytes: int
    ran: int = 0
    reused: int = 0
    skipped: int = 0
    out_of_time: bool = False
    elapsed_s: float = 0.0
    compared: list[TrialResult] = field(default_factory=list)
    """The results of `SearchPlan.compare`, in its order."""

    def baseline(self) -> TrialResult | None:
        return next((r for r in self.results if r.status == "ok" and _is_fp32_eager(r)), None)


def _is_fp32_eager(r: TrialResult) -> bool:
    changed = TuneConfig.from_dict(r.config).changed()
    return set(changed) <= {"batch_size", "grad_clip"}


class Search:
    """One run of the search. `runner` runs one trial in a worker (bench.run_one; tests count
    the trials through it)."""

    def __init__(
        self,
        plan: SearchPlan,
        store: ResultStore,
        out: TextIO = sys.stdout,
        strategy: Callable[[SearchSpace], SearchStrategy] = StagedSearch,
        runner: Callable[..., TrialResult] = bench.run_one,
        on_trial: Callable[[TrialResult, str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        self.out = out
        self.make_strategy = strategy
        self.runner = runner
        self.on_trial = on_trial
        self.progress = bench.Progress(out)
        environ = {**compile_cache_environ(), **dict(plan.spec.environ)}
        self.spec = replace(plan.spec, environ=tuple(environ.items()))
        self.counts = {"ran": 0, "reused": 0, "skipped": 0}
        self.order: list[TrialResult] = []
        self.out_of_time = False
        self._next = bench.NextWorker(self.spec)
        self.compared: list[TrialResult] = []
        self._pending = 0

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        self.started = time.monotonic()
        client, ready = bench.start_worker(self.spec)
        self._next.keep(client, ready)  # the first trial runs in the worker that described the machine
        try:
            self.caps = Capabilities(**ready.capabilities)
            self.environment = ready.environment
            self.workload = ready.workload
            self.default_batch = self.workload["default_batch_size"]
            self.workload_key = workload_key(self.workload, self.spec)
            self.space = default_space(
                self.caps, self.default_batch, self.plan.fixed, self.plan.choices
            )
            self.space.start().check_runnable(self.caps)
            self.budget_bytes = (
                self.plan.max_memory_bytes or default_memory_budget(self.environment)
            )
            self.history = History(self.space, self.budget_bytes)
            self.strategy = self.make_strategy(self.space)
            print(f"searching {self.space.describe() or 'one configuration'} "
                  f"(memory budget {gib(self.budget_bytes)}"
                  + (f", time budget {self.plan.budget_s / 60:g} min" if self.plan.budget_s else "")
                  + ")", file=self.out, flush=True)
            for config in self.plan.compare:
                config.check_runnable(self.caps)
            self.compared = [self.evaluate(self.space.canonical(c), aside=True)
                             for c in self.plan.compare]
            while not self.out_of_time:
                round_ = self.strategy.propose(self.history)
                if not round_:
                    break
                for i, config in enumerate(round_):
                    self._pending = len(round_) - i - 1
                    if self._time_left() <= 0:
                        self.out_of_time = True
                        print(f"time budget of {self.plan.budget_s / 60:g} min reached; "
                              "the remaining trials were not run", file=self.out, flush=True)
                        break
                    self.evaluate(config)
        finally:
            self._next.close()
        return self._outcome()

    def _time_left(self) -> float:
        if not self.plan.budget_s:
            return math.inf
        return self.plan.budget_s - (time.monotonic() - self.started)

    def evaluate(self, config: TuneConfig, use_estimate: bool = True, aside: bool = False) -> TrialResult:
        """Decide one configuration: reuse it from this search or the store, skip it by the
        memory estimate, or run it in a fresh worker."""
        done = self.history.get(config)
        if done is not None:
            return done
        steps = self._steps_for(config)
        stored = self.store.lookup(self.workload_key, config.to_dict(), steps,
                                   self.plan.warmup_steps, self.environment)
        if stored is not None and stored.result.status in REUSABLE:
            self._begin(config)
            self.progress.end(
                "skipped as measured (in the store): " + bench._summary(stored.result)
            )
            return self._decided(config, stored.result, "reused", aside)
        # The estimate first: a configuration that will not run needs no reference either.
        estimate = estimate_peak(config, self.history.all(), self.default_batch)
        if use_estimate and estimate is not None and estimate > self.budget_bytes:
            result = TrialResult(
                config=config.to_dict(), label=config.label(), status="skipped",
                workload=self.workload["name"], device=self.caps.device,
                batch_size=config.batch_size or self.default_batch,
                message=f"estimated peak {gib(estimate)} > memory budget {gib(self.budget_bytes)}",
            )
            self._begin(config)
            self.progress.end(f"skipped: {result.message}")
            return self._decided(config, result, "skipped", aside)
        reference = self._reference_for(config)
        self._begin(config)
        result = self._run(config, reference, steps)
        self.store.record(result, self.environment, self.workload_key, steps,
                          self.plan.warmup_steps)
        self.progress.end(bench._summary(result) + _compile_note(result))
        return self._decided(config, result, "ran", aside)

    def _begin(self, config: TuneConfig) -> None:
        index = len(self.order) + 1
        total = index + self._pending + self.strategy.remaining(self.history)
        best = self.history.best()
        note = _clock(time.monotonic() - self.started) + " elapsed"
        if best is not None:
            note += f", best {bench._si(best.tokens_per_s)} tokens/s"
        self.progress.begin(index, total, config.label(), note)

    def _decided(self, config: TuneConfig, result: TrialResult, how: str,
                 aside: bool = False) -> TrialResult:
        self.history.add(config, result, aside)
        self.order.append(result)
        self.counts[how] += 1
        if self.on_trial is not None:
            self.on_trial(result, how)
        return result

    def _steps_for(self, config: TuneConfig) -> int:
        """Measured steps for this trial. The fp32 reference of a batch size other than the
        baseline's is run only for its losses, so it stops once it has the steps the loss check
        compares (with fp32 eager at a large batch, a full trial would cost tens of seconds)."""
        start_batch = self.space.start().batch_size
        if config.batch_size != start_batch and bench.computes_reference(config):
            return max(1, min(self.plan.steps, LOSS_CHECK_STEPS - self.plan.warmup_steps))
        return self.plan.steps

    def _run(self, config: TuneConfig, reference: tuple[float, ...], steps: int) -> TrialResult:
        try:
            client, _ = self._next.take()
        except bench.WorkerStartError as exc:
            return TrialResult(config=config.to_dict(), label=config.label(), status="crash",
                               message=f"the worker did not start: {exc}")
        # The next trial's worker starts now; this trial's measured steps wait until it is up.
        self._next.begin(client)
        # A trial that starts inside the time budget may finish past it: cut at the budget's
        # end, a compiled trial of a large batch would be lost (seen on the H200: an HF Llama
        # at batch 16 killed after 60 s, its fp32 reference too).
        timeout = min(self.plan.trial_timeout_s, max(self._time_left(), TRIAL_GRACE_S))
        plan = bench.BenchPlan(self.spec, [], steps=steps,
                               warmup_steps=self.plan.warmup_steps, trial_timeout_s=timeout)
        try:
            return self.runner(client, config, plan, reference, self.progress,
                               stop_if_slower_than_ms=self._early_stop_ms(config, reference))
        finally:
            client.stop()

    def _early_stop_ms(self, config: TuneConfig, reference: tuple[float, ...]) -> float | None:
        """The step time above which this configuration is clearly slower than the best so far;
        None for reference runs (their losses are needed whole) and short trials."""
        best = self.history.best()
        if best is None or not reference or self.plan.steps <= self.plan.early_stop_after:
            return None
        batch = config.batch_size or self.default_batch
        tokens_per_step = batch * self.workload["items_per_sample"]
        slowest_tokens_per_s = best.tokens_per_s / self.plan.early_stop_ratio
        return tokens_per_step / slowest_tokens_per_s * 1e3

    def _reference_for(self, config: TuneConfig) -> tuple[float, ...]:
        """The fp32 eager losses for this configuration's batch size and gradient clipping: from
        any measured run that computes the reference (the baseline, say), else from
        `TuneConfig.reference` run first (with full checkpointing, which leaves the losses
        unchanged, when plain would not fit). () for a configuration that is its own reference,
        or when no reference could run."""
        if bench.computes_reference(config):
            return ()
        for result in self.history.all():
            done = TuneConfig.from_dict(result.config)
            if (result.status == "ok" and result.losses and bench.computes_reference(done)
                    and (done.batch_size, done.grad_clip) == (config.batch_size, config.grad_clip)):
                return tuple(result.losses[:LOSS_CHECK_STEPS])
        plain = TuneConfig.reference(config.batch_size).replace(grad_clip=config.grad_clip)
        for reference in (plain, plain.replace(checkpointing="full")):
            result = self.history.get(reference)
            if result is None:
                # Checkpointing's saving is estimated from measured pairs; with none measured the
                # estimate assumes no saving, so the checkpointed reference is tried instead (an
                # OOM costs one short trial; an unchecked loss would cost the correctness gate).
                trust = reference == plain or self._checkpoint_saving_measured("full")
                estimate = estimate_peak(reference, self.history.all(), self.default_batch)
                if trust and estimate is not None and estimate > self.budget_bytes:
                    continue
                result = self.evaluate(reference, use_estimate=trust)
            if result.status == "ok" and result.losses:
                return tuple(result.losses[:LOSS_CHECK_STEPS])
        return ()

    def _checkpoint_saving_measured(self, mode: str) -> bool:
        known = [(TuneConfig.from_dict(r.config), r) for r in self.history.all() if measured_peak(r)]
        return bool(_checkpoint_ratios(mode, known, lambda c: c.batch_size or self.default_batch))

    # -- the outcome ---------------------------------------------------------------------------
    def _outcome(self) -> SearchOutcome:
        results = list(self.order)
        eligible = self.history.eligible()
        ranked = sorted(eligible, key=lambda r: -r.tokens_per_s)
        ranked += [r for r in results if not any(r is x for x in ranked)]
        top = bench.best(eligible)
        outcome = SearchOutcome(
            results=results, ranked=ranked, eligible=len(eligible), front=pareto_front(eligible),
            recommendation=top,
            reason="", environment=self.environment, workload=self.workload,
            workload_key=self.workload_key, space=self.space, budget_bytes=self.budget_bytes,
            ran=self.counts["ran"], reused=self.counts["reused"], skipped=self.counts["skipped"],
            out_of_time=self.out_of_time, elapsed_s=time.monotonic() - self.started,
            compared=list(self.compared),
        )
        outcome.reason = explain(outcome)
        return outcome


def _compile_note(result: TrialResult) -> str:
    if result.status in ("ok", "stopped") and result.compile_s is not None:
        return f", first step {result.compile_s:.1f} s"
    return ""


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def compile_cache_environ() -> dict[str, str]:
    """One Inductor cache for every trial (and every search) on this machine, under the gputune
    home so it outlives /tmp; the FX graph and AOT autograd caches switched on explicitly. A
    variable the user already set is left alone."""
    wanted = {
        "TORCHINDUCTOR_CACHE_DIR": str(gputune_home() / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    return {k: v for k, v in wanted.items() if k not in os.environ}


def workload_key(workload: dict, spec: WorkerSpec) -> str:
    """What makes two runs of a workload the same: its name, sequence length, seed and data."""
    data = f"data={Path(spec.data).resolve()}" if spec.data else "synthetic"
    return f"{workload['name']} seq={workload['items_per_sample']} seed={spec.seed} {data}"


def default_memory_budget(environment: dict) -> int:
    if environment.get("gpu_memory_bytes"):
        return int(environment["gpu_memory_bytes"])
    import psutil

    return int(psutil.virtual_memory().available)


def pareto_front(results: Iterable[TrialResult]) -> list[TrialResult]:
    """The trials no other beats on both throughput and peak memory, fastest first."""
    front: list[TrialResult] = []
    lowest = math.inf
    for r in sorted(results, key=lambda r: (-r.tokens_per_s, measured_peak(r) or math.inf)):
        peak = measured_peak(r)
        if peak is None:
            continue
        if peak < lowest:
            front.append(r)
            lowest = peak
    return front


def _checked_at_another_batch(top: TrialResult, results: Iterable[TrialResult]) -> TrialResult | None:
    """A trial of the same numerics as `top` (every option but batch size and checkpointing)
    whose loss check passed."""
    same = {"batch_size": 0, "checkpointing": "off", "checkpoint_every": 0}

    def numerics(r: TrialResult) -> dict:
        return {**r.config, **same}

    return next((r for r in results if r.loss_ok and numerics(r) == numerics(top)), None)


def explain(outcome: SearchOutcome) -> str:
    """Why the recommendation won, in one sentence for the exported file."""
    top = outcome.recommendation
    if top is None:
        return ("no configuration of the space ran within the memory budget and kept the fp32 "
                "reference's loss")
    eligible = outcome.ranked[:outcome.eligible]
    parts = [f"fastest of {len(eligible)} configuration{'s' if len(eligible) != 1 else ''} "
             "that ran and kept the loss"]
    if _is_fp32_eager(top):
        parts[0] += " (it is the fp32 eager reference itself)"
    elif top.loss_ok:
        parts[0] += (f" (within {top.loss_max_rel_error:.1e} of the fp32 reference, tolerance "
                     f"{top.loss_tolerance:.1%} for {top.config['precision']})")
    elif top.loss_ok is None:
        checked = _checked_at_another_batch(top, outcome.results)
        if checked is not None:
            # Batch size and checkpointing leave the numerics alone: the same precision,
            # compile and kernels kept the loss at another batch size.
            parts[0] += (f" (its loss checked at batch {checked.batch_size}: within "
                         f"{checked.loss_max_rel_error:.1e} of the fp32 reference; no fp32 "
                         f"reference ran at batch {top.batch_size})")
        else:
            parts[0] += (f" (its loss could not be checked: no fp32 reference ran at batch "
                         f"{top.batch_size})")
    base = outcome.baseline()
    if base is not None and base is not top:
        parts.append(f"{top.tokens_per_s / base.tokens_per_s:.2f}x the fp32 eager baseline")
    for other in outcome.compared:
        if other is not top and other.status == "ok" and other.tokens_per_s:
            parts.append(f"{top.tokens_per_s / other.tokens_per_s:.2f}x {other.label} "
                         "(--compare, same run)")
    runner_up = next((r for r in eligible if r is not top), None)
    if runner_up is not None:
        parts.append(f"{top.tokens_per_s / runner_up.tokens_per_s - 1:.1%} faster than the "
                     f"runner-up ({runner_up.label})")
    peak = measured_peak(top)
    if peak is not None:
        parts.append(f"peak {gib(peak)} within the {gib(outcome.budget_bytes)} budget")
    return "; ".join(parts)


def export(outcome: SearchOutcome, path: str | os.PathLike) -> Path | None:
    top = outcome.recommendation
    if top is None:
        return None
    measured = {k: v for k, v in top.to_dict().items()
                if k in ("tokens_per_s", "samples_per_s", "step_ms", "mfu", "peak_memory_bytes",
                         "peak_reserved_bytes", "compile_s", "loss_ok", "loss_max_rel_error",
                         "batch_size", "sequence_length")}
    measured["reason"] = outcome.reason
    measured["search_trials"] = len(outcome.results)
    return save(ExportedConfig(TuneConfig.from_dict(top.config), measured, outcome.environment,
                               outcome.workload["name"]), path)


def write_json(path: str | os.PathLike, outcome: SearchOutcome, plan: SearchPlan) -> None:
    doc = {
        "tool": "gputune tune",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": outcome.workload,
        "steps": plan.steps,
        "warmup_steps": plan.warmup_steps,
        "memory_budget_bytes": outcome.budget_bytes,
        "space": {k: [list(v) if isinstance(v, tuple) else v for v in vs]
                  for k, vs in outcome.space.choices},
        "environment": outcome.environment,
        "results": [r.to_dict() for r in outcome.ranked],
        "pareto_front": [r.label for r in outcome.front],
        "recommendation": outcome.recommendation.to_dict() if outcome.recommendation else None,
        "reason": outcome.reason,
        "compared": [
            dict(r.to_dict(), recommendation_speedup=(
                outcome.recommendation.tokens_per_s / r.tokens_per_s
                if outcome.recommendation and r.tokens_per_s else None))
            for r in outcome.compared
        ],
        "counts": {"ran": outcome.ran, "reused": outcome.reused, "skipped": outcome.skipped},
    }
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def report(outcome: SearchOutcome) -> str:
    """The ranked table, the Pareto front and the recommendation, as printed by `gputune tune`."""
    base = outcome.baseline()
    lines = [
        f"{len(outcome.results)} trials in {_clock(outcome.elapsed_s)}: {outcome.ran} ran, "
        f"{outcome.reused} reused from the store, {outcome.skipped} skipped over the memory "
        "budget" + (" (time budget reached)" if outcome.out_of_time else ""),
        "",
        "Ranked (x base: against the fp32 eager baseline):",
        bench.format_table(outcome.ranked, baseline=base.tokens_per_s if base else None),
    ]
    if outcome.front:
        lines += ["", "Throughput / memory Pareto front:", bench.format_table(
            outcome.front, baseline=base.tokens_per_s if base else None)]
    lines.append("")
    if outcome.recommendation:
        lines.append(f"Recommended: {outcome.recommendation.label}: {outcome.reason}")
    else:
        lines.append(f"No recommendation: {outcome.reason}")
    return "\n".join(lines)

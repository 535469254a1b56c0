"""Memory: what a trial's peak counts as, the estimate of a configuration's peak from the trials
measured so far, the throughput/memory Pareto front, and memory sizes the user types. Torch-free.

Everything here is per device: with devices > 1 a trial's peak is its largest rank's, and the
estimate is what one rank holds (FSDP2 shards parameters, gradients and optimizer state; each
rank's activations are those of its own micro-batch)."""

from __future__ import annotations

import functools
import math
import re
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from strategies.config import TuneConfig
from strategies.errors import ConfigError
from strategies.registry import ACTIVATION_KEYS, OPTIONS
from tuner_tui.engine.protocol import TrialResult, measured_peak
from tuner_tui.engine.search.memory_prior import (
    ModelShape, autocast_copy_bytes, optimizer_copy_bytes, per_sample_bytes, shards,
)

WEIGHT_BYTES = OPTIONS["weights"].search.bytes_per_parameter
"""Bytes per parameter, and per gradient (gradients take the parameters' dtype), by `weights`."""
STATE_BYTES = OPTIONS["optimizer_state"].search.bytes_per_parameter
"""Bytes per parameter of AdamW's two moments on the training device, by `optimizer_state`
(8-bit adds a scale per block of 256, under 1%; offload keeps them in host memory)."""

COMPUTE_BYTES = {"bf16": 2, "fp16": 2}
"""Bytes per parameter FSDP2 gathers in, by precision (its mixed precision policy); fp32 and tf32
gather fp32, bf16 weights gather bf16 (`strategies.data_parallel.mixed_precision_policy`)."""

ALIKE_BYTES_SHARE = 0.001
"""An estimate within this share of the measured peak it scaled nothing from is that peak."""

SKIP_MARGIN = 1.15
"""An estimate skips a trial only when it is this far over the budget: near it, the trial runs
and is measured."""

@dataclass(frozen=True)
class MemoryEstimate:
    """A configuration's peak, part by part."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    """Everything else at the peak: activations, logits and loss buffers, compile overhead,
    scaled from a measured trial (`basis`) by the micro-batch size."""
    data_parallel: int = 0
    """What data parallel adds on each device (`data_parallel_bytes`)."""
    basis: str = ""
    certain: bool = True
    """False where the activations rest on an unmeasured checkpointing saving (a prior): such an
    estimate never skips a trial."""
    alike: bool = False
    """The measured trial it rests on holds what this configuration would: no option that the
    estimate scales or computes differs (more or fewer micro-batches of the same size
    accumulated), so the estimate is that trial's measured peak."""

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer_state + self.activations
                + self.data_parallel)

    def to_dict(self) -> dict:
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer_state": self.optimizer_state, "activations": self.activations,
                "data_parallel": self.data_parallel, "total": self.total, "basis": self.basis,
                "certain": self.certain, "alike": self.alike}


def parameter_count(measured: Iterable[TrialResult]) -> int | None:
    """The model's parameter count, from the parameter bytes a trial measured (one rank's
    shard, under FSDP2: times the devices)."""
    for r in measured:
        parts = r.memory_parts or {}
        if parts.get("parameters"):
            config = r.tune_config
            return int(parts["parameters"] * shards(config) / WEIGHT_BYTES[config.weights])
    return None


def trainable_count(measured: Iterable[TrialResult]) -> int | None:
    """How many of the model's parameters train (have gradients and optimizer state), from the
    bytes a trial measured; None where no trial counted them (then all of them are taken to)."""
    for r in measured:
        parts = r.memory_parts or {}
        if parts.get("parameters") and parts.get("trainable") is not None:
            config = r.tune_config
            return int(parts["trainable"] * shards(config) / WEIGHT_BYTES[config.weights])
    return None


def static_parts(config: TuneConfig, n_params: int,
                 trainable: int | None = None) -> tuple[int, int, int]:
    """Parameters, gradients and optimizer state of `config` on one device, in bytes; the last
    two for the `trainable` parameters alone (None: all of them). A frozen backbone with small
    adapters holds its weights and hardly anything else: counted whole, its state put a CPU
    model's estimates at 362 MiB where 161 MiB was measured."""
    w, n = WEIGHT_BYTES[config.weights], math.ceil(n_params / shards(config))
    t = n if trainable is None else math.ceil(trainable / shards(config))
    return n * w, t * w, t * STATE_BYTES[config.optimizer_state]


def data_parallel_bytes(config: TuneConfig, n_params: int, trainable: int | None = None) -> int:
    """What data parallel holds on each device besides the model's parts: DDP's all-reduce
    buckets, a second copy of the gradients (none where the gradients are views into them,
    ddp_bucket_view); under FSDP2 without resharding after forward, every block's gathered
    parameters from its forward to its backward (with resharding, one or two blocks' at a time,
    which the activations' share of a measured peak holds)."""
    if config.parallel == "ddp" and not config.ddp_bucket_view:
        return (n_params if trainable is None else trainable) * WEIGHT_BYTES[config.weights]
    if config.parallel == "fsdp2" and not config.fsdp_reshard:
        gathered = COMPUTE_BYTES.get(config.precision, WEIGHT_BYTES[config.weights])
        return n_params * gathered
    return 0


def fixed_bytes(config: TuneConfig, n_params: int, trainable: int | None = None) -> int:
    """Everything of `config`'s peak that does not scale with the micro-batch."""
    return (sum(static_parts(config, n_params, trainable))
            + data_parallel_bytes(config, n_params, trainable))


def micro_batch(config: TuneConfig, default_batch: int) -> int:
    """Samples per forward/backward on one device, what activations scale with: the
    micro-batch, else each rank's share of the batch."""
    if config.micro_batch_size:
        return config.micro_batch_size
    return max(1, (config.batch_size or default_batch) // config.devices)


def _activation_values(c: TuneConfig, key: str):
    value = c.effective_kernels() if key == "fused_kernels" else c[key]
    if key == "checkpointing":
        return (value, c.checkpoint_every if value == "every-n" else 0)
    return value


ACTIVATION_AXES = tuple(k for k in ACTIVATION_KEYS if k != "checkpoint_every")
"""Where two configurations can differ in what a sample holds (checkpoint_every goes with
checkpointing, and the kernels are compared as `effective_kernels`)."""


@functools.lru_cache(maxsize=100_000)
def _activation_signature(c: TuneConfig) -> tuple:
    return tuple(_activation_values(c, k) for k in ACTIVATION_AXES)


def _differing(a: TuneConfig, b: TuneConfig) -> list[str]:
    return [k for k, x, y in zip(ACTIVATION_AXES, _activation_signature(a),
                                 _activation_signature(b)) if x != y]


def estimate(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int,
    shape: ModelShape | None = None,
) -> MemoryEstimate | None:
    """`config`'s peak from the trials measured so far: its parameters, gradients and optimizer
    state from the parameter count and their dtypes, and the rest (activations, logits and loss
    buffers, compile overhead) from the nearest measured configuration (the fewest activation
    options different, then the closest micro-batch). Each option that differs from the nearest
    scales what a sample holds by the ratio measured between a pair of trials differing in that
    option alone (full checkpointing over none, the fused loss over HF's, ...); where no such
    pair was measured the estimate is not `certain` (it then never skips a trial) and the ratio
    is the prior's from the model's shapes (`memory_prior`), or 1 without them.

    With the shapes (`shape`, else a measured trial's `model_shape`), what a step holds whatever
    its micro-batch is set apart before scaling by the micro-batch: autocast's weight copies,
    beside the activations (`memory_prior.autocast_copy_bytes`), and the optimizer step's
    working copies, after them (`optimizer_copy_bytes`: the rest is the larger of the two
    moments). Without the shapes the whole rest is per-sample, which over-estimates larger
    micro-batches (the safe side). A trial measured without its parts counts its whole peak as
    per-sample. None when nothing was measured.

    Estimating many configurations from the same trials: `Measured(...).estimate(config)` reads
    the trials once."""
    return Measured(measured, default_batch, shape).estimate(config)


class Measured:
    """The trials measured so far, read once for `estimate`: the parameter count, the shapes,
    what a sample held in each trial and the ratios between pairs (a search estimates thousands
    of candidates between two trials)."""

    def __init__(self, measured: Iterable[TrialResult], default_batch: int,
                 shape: ModelShape | None = None) -> None:
        self.default_batch = default_batch
        self.known = [(r.tune_config, r) for r in measured if measured_peak(r)]
        known = self.known
        self.n_params = parameter_count(r for _, r in known) if known else None
        self.trainable = trainable_count(r for _, r in known) if known else None
        if shape is None:
            shape = next((s for s in (ModelShape.from_dict(r.model_shape) for _, r in known)
                          if s), None)
        self.shape = shape if self.n_params is not None else None  # the step's part needs it
        self._per_sample: dict[int, float] = {}
        self._ratios: dict[tuple, float | None] = {}
        self._step_bound = {id(r): self._is_step_bound(c, r) for c, r in known}
        self.pairs = [(c, r) for c, r in known if not self._step_bound[id(r)]]
        self._unordered: list | None = None
        self._signatures: dict[int, tuple] | None = None

    def micro(self, c: TuneConfig) -> int:
        return micro_batch(c, self.default_batch)

    def beside(self, c: TuneConfig) -> float:
        if self.shape is None:
            return 0.0
        return held_beside(c, self.n_params, self.default_batch, self.trainable)

    def after(self, c: TuneConfig) -> float:
        """Held at the optimizer step, once activations are freed."""
        return optimizer_copy_bytes(c, self.shape) if self.shape is not None else 0.0

    def _is_step_bound(self, c: TuneConfig, r: TrialResult) -> bool:
        """True when the optimizer step may have set this trial's peak: its activations are
        then unknown (only bounded), and a full-checkpointing trial's 4 GiB of step copies
        taken for activations and scaled to no checkpointing had put an estimate 6x over."""
        return (self.n_params is not None and self.after(c) > 0
                and measured_peak(r) - fixed_bytes(c, self.n_params, self.trainable)
                <= 1.05 * self.after(c))

    def per_sample(self, c: TuneConfig, r: TrialResult) -> float:
        """What a sample held in the trial `r` of `c`."""
        found = self._per_sample.get(id(r))
        if found is None:
            found = self._per_sample[id(r)] = self._read_per_sample(c, r)
        return found

    def _read_per_sample(self, c: TuneConfig, r: TrialResult) -> float:
        if self.n_params is None:
            return measured_peak(r) / self.micro(c)
        rest = max(1, measured_peak(r) - fixed_bytes(c, self.n_params, self.trainable)
                   - self.beside(c))
        if self._step_bound[id(r)]:  # activations at most `rest`: the prior's, up to that
            rest = min(rest, per_sample_bytes(c, self.shape) * self.micro(c))
        return rest / self.micro(c)

    def ratio(self, key: str, to_value, from_value) -> float | None:
        """`option_ratio` over the trials the optimizer step did not bound, once per question."""
        question = (key, to_value, from_value)
        if question not in self._ratios:
            self._ratios[question] = option_ratio(key, to_value, from_value, self.pairs,
                                                  self.per_sample)
        return self._ratios[question]

    def estimate(self, config: TuneConfig) -> MemoryEstimate | None:
        """`estimate(config, ...)` from these trials."""
        if not self.known:
            return None
        n_params, shape, micro = self.n_params, self.shape, self.micro
        target_micro = micro(config)
        if self._signatures is None:  # (read once: thousands of candidates per decision)
            self._signatures = {id(r): _activation_signature(c) for c, r in self.known}
        own = _activation_signature(config)

        def distance(item):
            c, r = item
            others = sum(x != y for x, y in zip(self._signatures[id(r)], own))
            if n_params is None:  # parameters and state are in the measured peak, not computed
                others += sum(c[k] != config[k] for k in OPTIONS
                              if k not in ACTIVATION_KEYS + ("batch_size", "micro_batch_size"))
            # Among as near: the same compile mode (CUDA graphs keep their own memory pool,
            # which no per-sample ratio carries), then the closest micro-batch.
            return (others, c.compile_mode != config.compile_mode,
                    abs(math.log(micro(c) / target_micro)))

        near_config, near = min(self.known, key=distance)
        ratio, certain = 1.0, not self._step_bound[id(near)]
        step = near_config
        unscaled = distance((near_config, near)) == (0, False, 0.0)
        for key, moved in _walk(near_config, config):
            found = self.ratio(key, _activation_values(config, key),
                               _activation_values(near_config, key))
            if found is None:
                certain = False
                if shape is not None:
                    found = (per_sample_bytes(moved, shape)
                             / max(1.0, per_sample_bytes(step, shape)))
            ratio *= found if found is not None else 1.0
            step = moved
        rest = max(self.per_sample(near_config, near) * ratio * target_micro
                   + self.beside(config), self.after(config))
        statics = ((0, 0, 0) if n_params is None
                   else static_parts(config, n_params, self.trainable))
        extra = 0 if n_params is None else data_parallel_bytes(config, n_params, self.trainable)
        estimated = MemoryEstimate(*statics, int(rest), extra, near.label, certain)
        peak = measured_peak(near)
        if certain and unscaled and abs(estimated.total - peak) <= ALIKE_BYTES_SHARE * peak:
            estimated = replace(estimated, alike=True)
        floor = self.floor(config)
        if floor is not None and measured_peak(floor) > estimated.total:
            # A measured trial it holds at least as much as: never below that trial's peak
            # (llama-1b on an H100: float8 and checkpointing off, estimated 17.6 GiB from a
            # selective trial, measured 21.3-21.9, where the same with float8 had held 18.9).
            estimated = replace(estimated, activations=estimated.activations
                                + measured_peak(floor) - estimated.total,
                                basis=f"{near.label}; at least {floor.label}", certain=True)
        return estimated

    def floor(self, config: TuneConfig) -> TrialResult | None:
        """The measured trial of the largest peak that `config` holds at least as much as."""
        if self._unordered is None:  # (read once: thousands of candidates per decision)
            self._unordered = [(_unordered(c), c, r) for c, r in self.known]
        own = _unordered(config)
        below = [r for same, c, r in self._unordered
                 if same == own and _ordered_at_least(config, c, self.default_batch)]
        return max(below, key=measured_peak, default=None)


def _order(key: str, compiled: bool) -> dict:
    facts = OPTIONS[key].search
    return (facts.holds_compiled if compiled else {}) or facts.holds or facts.bytes_per_parameter


_ORDERED = tuple(k for k in OPTIONS if _order(k, True))
_EQUAL = tuple(k for k in OPTIONS if not _order(k, True)
               and k not in ("batch_size", "micro_batch_size", "checkpoint_every"))


def holds_at_least(config: TuneConfig, other: TuneConfig, default_batch: int) -> bool:
    """Whether a step of `config` holds at least what one of `other` holds: the options without
    a declared order (`SearchFacts.holds`, `holds_compiled`, `bytes_per_parameter`) alike, each
    ordered one at the same or a higher rank, a micro-batch as large or larger, and both
    accumulating or neither (a whole-model graph that accumulates holds a second set of
    gradients)."""
    return _unordered(config) == _unordered(other) and _ordered_at_least(config, other,
                                                                         default_batch)


def _unordered(c: TuneConfig) -> tuple:
    return tuple(c[k] for k in _EQUAL)


def _ordered_at_least(config: TuneConfig, other: TuneConfig, default_batch: int) -> bool:
    """`holds_at_least` for two configurations alike in the options of no declared order."""
    if config.checkpointing == other.checkpointing == "every-n" \
            and config.checkpoint_every != other.checkpoint_every:
        return False
    compiled = config.compile_mode != "off"  # (compile_mode is alike in both)
    for key in _ORDERED:
        a, b = config[key], other[key]
        if a != b:
            order = _order(key, compiled)
            if a not in order or b not in order or order[a] <= order[b]:
                return False
    micro, micro_other = micro_batch(config, default_batch), micro_batch(other, default_batch)
    return micro >= micro_other and _accumulates(config, default_batch) == _accumulates(
        other, default_batch)


def _accumulates(c: TuneConfig, default_batch: int) -> bool:
    return micro_batch(c, default_batch) < max(1, (c.batch_size or default_batch) // c.devices)


def held_beside(c: TuneConfig, n_params: int, default_batch: int,
                trainable: int | None = None) -> float:
    """Held beside the activations whatever the micro-batch: autocast's weight copies and, where
    a whole-model graph accumulates gradients, the new gradients it returns at once beside those
    it adds them to (seen on the H200: micro-batch 2 held 2.8 GiB more than its activations, the
    gradients of the HF Llama in bf16)."""
    extra = autocast_copy_bytes(c, n_params)
    if c.compile_mode != "off" and c.compile_scope == "model" and _accumulates(c, default_batch):
        extra += static_parts(c, n_params, trainable)[1]
    return extra


def prior_estimate(config: TuneConfig, result: TrialResult, default_batch: int,
                   shape: ModelShape | None = None) -> MemoryEstimate | None:
    """The estimate of a run's first trial, which has no measured trial before it: from what its
    worker counted before the first step, the parameter bytes (`memory_parts`) and the model's
    shapes (`model_shape`, or `shape`), never from its peak. Parameters, gradients and state by
    their dtypes, and the shape prior's activations (`memory_prior.per_sample_bytes`) at its
    micro-batch; never `certain`. None where the worker counted neither (a failed build)."""
    shape = shape or ModelShape.from_dict(result.model_shape)
    n_params, trainable = parameter_count([result]), trainable_count([result])
    if shape is None or n_params is None:
        return None
    activations = per_sample_bytes(config, shape) * micro_batch(config, default_batch)
    rest = max(activations + held_beside(config, n_params, default_batch, trainable),
               optimizer_copy_bytes(config, shape))
    return MemoryEstimate(*static_parts(config, n_params, trainable), int(rest),
                          data_parallel_bytes(config, n_params, trainable), "the model's shapes",
                          False)


def _walk(start: TuneConfig, target: TuneConfig) -> Iterator[tuple[str, TuneConfig]]:
    """From `start` to `target` one differing activation option at a time, each step a valid
    configuration: a move the rules refuse on its own (precision fp32 while the weights are
    still bf16) waits until the options it needs have moved."""
    step, pending = start, _differing(start, target)
    while pending:
        for key in pending:
            try:
                moved = _with_option(step, target, key)
            except ConfigError:
                continue
            pending.remove(key)
            yield key, moved
            step = moved
            break
        else:  # held by an option that is not walked (offloaded state needs no fp16): the
            for key in pending:  # measured ratios still apply, the prior's says nothing
                yield key, step
            return


def _with_option(c: TuneConfig, target: TuneConfig, key: str) -> TuneConfig:
    """`c` with `key` (and what goes with it) as in `target`, for a prior's ratio."""
    if key == "checkpointing":
        return c.replace(checkpointing=target.checkpointing,
                         checkpoint_every=target.checkpoint_every)
    if key == "fused_kernels":
        return c.replace(fused_kernels=target.fused_kernels,
                         kernels_with_compile=target.kernels_with_compile)
    return c.replace(**{key: target[key]})


def option_ratio(key, to_value, from_value, known, per_sample) -> float | None:
    """What a sample holds with `key` at `to_value` over `from_value`, the median over measured
    pairs of trials that differ in that option alone (batch, micro-batch and the options that
    only change parameters and state aside); None where no pair was measured."""
    ratios = []
    for c, r in known:
        if _activation_values(c, key) != to_value:
            continue
        for c2, r2 in known:
            if _activation_values(c2, key) == from_value and _differing(c, c2) == [key]:
                ratios.append(per_sample(c, r) / per_sample(c2, r2))
    return statistics.median(ratios) if ratios else None


def estimate_or_none(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int
) -> MemoryEstimate | None:
    """`estimate`, or None where it cannot be made: an estimate says nothing then, and never
    stops a search."""
    try:
        return estimate(config, measured, default_batch)
    except Exception:
        return None


def estimate_peak(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int
) -> int | None:
    """The total of `estimate`, or None."""
    found = estimate(config, measured, default_batch)
    return found.total if found is not None else None


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

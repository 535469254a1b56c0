"""Memory: what a trial's peak counts as, the estimate of a configuration's peak from the trials
measured so far, the throughput/memory Pareto front, and memory sizes the user types. Torch-free."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Iterable

from strategies.config import TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.protocol import TrialResult, measured_peak

CHECKPOINT_PRIOR = 1.0
"""Activations per sample of a checkpointed run relative to no checkpointing, until measured: 1.0,
so an unmeasured checkpointing mode is never assumed to fit where no checkpointing would not."""

WEIGHT_BYTES = {"fp32": 4, "bf16": 2}
"""Bytes per parameter, and per gradient (gradients take the parameters' dtype), by `weights`."""
STATE_BYTES = {"fp32": 8, "bf16": 4, "8bit": 2, "offload": 0}
"""Bytes per parameter of AdamW's two moments on the training device, by `optimizer_state`
(8-bit adds a scale per block of 256, under 1%; offload keeps them in host memory)."""

SKIP_MARGIN = 1.15
"""An estimate skips a trial only when it is this far over the budget: near it, the trial runs
and is measured."""

ACTIVATION_KEYS = ("precision", "weights", "attention", "fused_kernels", "fp8", "checkpointing",
                   "checkpoint_every", "compile_mode", "compile_scope", "optimizer")
"""The options that change what a run holds besides parameters, gradients and optimizer state
(activations, logits and loss buffers, autocast's weight copies, compiled graphs' buffers, the
optimizer's temporaries). Batch and micro-batch sizes scale it; the rest leave it alone."""


@dataclass(frozen=True)
class MemoryEstimate:
    """A configuration's peak, part by part."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    """Everything else at the peak: activations, logits and loss buffers, compile overhead,
    scaled from a measured trial (`basis`) by the micro-batch size."""
    basis: str = ""
    certain: bool = True
    """False where the activations rest on an unmeasured checkpointing saving (a prior): such an
    estimate never skips a trial."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def to_dict(self) -> dict:
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer_state": self.optimizer_state, "activations": self.activations,
                "total": self.total, "basis": self.basis, "certain": self.certain}


def parameter_count(measured: Iterable[TrialResult]) -> int | None:
    """The model's parameter count, from the parameter bytes a trial measured."""
    for r in measured:
        parts = r.memory_parts or {}
        if parts.get("parameters"):
            weights = r.config.get("weights", "fp32")
            return int(parts["parameters"] / WEIGHT_BYTES[weights])
    return None


def static_parts(config: TuneConfig, n_params: int) -> tuple[int, int, int]:
    """Parameters, gradients and optimizer state of `config`, in bytes."""
    w = WEIGHT_BYTES[config.weights]
    return n_params * w, n_params * w, n_params * STATE_BYTES[config.optimizer_state]


def micro_batch(config: TuneConfig, default_batch: int) -> int:
    """Samples per forward/backward: what activations scale with."""
    return config.micro_batch_size or config.batch_size or default_batch


def _activation_values(c: TuneConfig, key: str):
    value = c.effective_kernels() if key == "fused_kernels" else c[key]
    if key == "checkpointing":
        return (value, c.checkpoint_every if value == "every-n" else 0)
    return value


ACTIVATION_AXES = tuple(k for k in ACTIVATION_KEYS if k != "checkpoint_every")
"""Where two configurations can differ in what a sample holds (checkpoint_every goes with
checkpointing, and the kernels are compared as `effective_kernels`)."""


def _differing(a: TuneConfig, b: TuneConfig) -> list[str]:
    return [k for k in ACTIVATION_AXES if _activation_values(a, k) != _activation_values(b, k)]


def estimate(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int
) -> MemoryEstimate | None:
    """`config`'s peak from the trials measured so far: its parameters, gradients and optimizer
    state from the parameter count and their dtypes, and the rest (activations, logits and loss
    buffers, compile overhead) per sample from the nearest measured configuration (the fewest
    activation options different, then the closest micro-batch), times the micro-batch. Each
    option that differs from the nearest scales the rest by the ratio measured between a pair of
    trials differing in that option alone (full checkpointing over none, the fused loss over
    HF's, ...); where no such pair was measured the ratio is 1 and the estimate is not `certain`
    (it then never skips a trial). A trial measured without its parts counts its whole peak as
    per-sample, which over-estimates larger micro-batches (the safe side). None when nothing
    was measured."""
    known = [(TuneConfig.from_dict(r.config), r) for r in measured if measured_peak(r)]
    if not known:
        return None
    n_params = parameter_count(r for _, r in known)

    def micro(c: TuneConfig) -> int:
        return micro_batch(c, default_batch)

    def rest(c: TuneConfig, r: TrialResult) -> float:
        if n_params is None:
            return measured_peak(r)
        return max(1, measured_peak(r) - sum(static_parts(c, n_params)))

    def distance(item):
        c, _ = item
        others = len(_differing(c, config))
        if n_params is None:  # parameters and state are in the measured peak, not computed
            others += sum(c[k] != config[k] for k in OPTIONS
                          if k not in ACTIVATION_KEYS + ("batch_size", "micro_batch_size"))
        return (others, abs(math.log(micro(c) / micro(config))))

    near_config, near = min(known, key=distance)
    ratio, certain = 1.0, True
    for key in _differing(near_config, config):
        found = option_ratio(key, _activation_values(config, key),
                             _activation_values(near_config, key), known, micro, rest)
        if found is None:
            certain = False
        else:
            ratio *= found
    per_sample = rest(near_config, near) / micro(near_config) * ratio
    statics = static_parts(config, n_params) if n_params is not None else (0, 0, 0)
    return MemoryEstimate(*statics, int(per_sample * micro(config)), near.label, certain)


def option_ratio(key, to_value, from_value, known, micro, rest) -> float | None:
    """What a sample holds with `key` at `to_value` over `from_value`, the median over measured
    pairs of trials that differ in that option alone (batch, micro-batch and the options that
    only change parameters and state aside); None where no pair was measured."""
    ratios = []
    for c, r in known:
        if _activation_values(c, key) != to_value:
            continue
        for c2, r2 in known:
            if _activation_values(c2, key) == from_value and _differing(c, c2) == [key]:
                ratios.append((rest(c, r) / micro(c)) / (rest(c2, r2) / micro(c2)))
    return statistics.median(ratios) if ratios else None


def estimate_peak(
    config: TuneConfig, measured: Iterable[TrialResult], default_batch: int
) -> int | None:
    """The total of `estimate`, or None."""
    found = estimate(config, measured, default_batch)
    return found.total if found is not None else None


def activations(result: TrialResult, n_params: int | None, default_batch: int) -> int | None:
    """What a measured trial held beyond parameters, gradients and optimizer state."""
    peak = measured_peak(result)
    if peak is None or n_params is None:
        return None
    return max(0, peak - sum(static_parts(TuneConfig.from_dict(result.config), n_params)))


def checkpoint_ratios(mode: str, known, micro, n_params: int | None = None) -> list[float]:
    """What `mode` holds per sample beyond parameters, gradients and state (the whole peak where
    the parameter count is unknown), over the same configuration without checkpointing: one
    ratio per measured pair. `known` holds (config, result) pairs with a measured peak."""

    def rest(c: TuneConfig, r: TrialResult) -> float:
        if n_params is None:
            return measured_peak(r)
        return max(1, measured_peak(r) - sum(static_parts(c, n_params)))

    ratios = []
    for c, r in known:
        if c.checkpointing != mode:
            continue
        for c_off, r_off in known:
            if c_off.checkpointing == "off" and c_off.replace(
                batch_size=c.batch_size, micro_batch_size=c.micro_batch_size,
                checkpointing=mode, checkpoint_every=c.checkpoint_every,
            ) == c:
                ratios.append((rest(c, r) / micro(c)) / (rest(c_off, r_off) / micro(c_off)))
    return ratios


def checkpoint_ratio(mode: str, known, micro, n_params: int | None = None) -> float:
    """The median of the measured ratios for `mode`; CHECKPOINT_PRIOR until one is measured."""
    if mode == "off":
        return 1.0
    ratios = checkpoint_ratios(mode, known, micro, n_params)
    return statistics.median(ratios) if ratios else CHECKPOINT_PRIOR


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

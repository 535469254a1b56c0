"""Memory: what a trial's peak counts as, the estimate of a configuration's peak from the trials
measured so far, the throughput/memory Pareto front, and memory sizes the user types. Torch-free."""

from __future__ import annotations

import math
import re
import statistics
from typing import Iterable

from strategies.config import TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.protocol import TrialResult

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
    ratio = checkpoint_ratio(config.checkpointing, known, batch) / checkpoint_ratio(
        near_config.checkpointing, known, batch
    )
    return int(per_sample * ratio * batch(config))


def checkpoint_ratios(mode: str, known, batch) -> list[float]:
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


def checkpoint_ratio(mode: str, known, batch) -> float:
    """The median of the measured ratios for `mode`; CHECKPOINT_PRIOR until one is measured."""
    if mode == "off":
        return 1.0
    ratios = checkpoint_ratios(mode, known, batch)
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

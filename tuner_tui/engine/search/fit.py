"""The chance that a configuration fits the memory budget, from the memory model's estimate
(`memory.estimate`) and how far such estimates are known to miss: about 1% where the estimate is
a measured trial's own peak (`alike`), within about 7% where every option's effect was measured
here (`certain`), about 20% where a prior from the model's shapes stands in. Torch-free."""

from __future__ import annotations

import math
from typing import Sequence

from strategies.config import TuneConfig
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.history import History, config_key
from tuner_tui.engine.search.memory import (
    Measured, MemoryEstimate, estimate_or_none, parameter_count, prior_estimate,
)

CERTAIN_SD = 0.07
UNCERTAIN_SD = 0.20
ALIKE_SD = 0.01
"""Where the estimate is a measured trial's own peak (`MemoryEstimate.alike`): the same
configuration's peak repeats to the MiB on the GPU (8-bit and bf16 state, interleaved twice on
three models); 1% is left for what the estimate does not see."""
NOT_FITTING = 0.02
"""A candidate less likely than this to fit the budget (a reference, the device) is not run."""
# How sharply the chance to fit falls as an estimate nears one that ran out of memory.
OOM_RATIO_SD = 0.03


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def chance_within(found: MemoryEstimate, limit: int) -> float:
    """The chance that a configuration estimated at `found` holds at most `limit` bytes, by how
    far such estimates are known to miss."""
    sd = (ALIKE_SD if found.alike else CERTAIN_SD if found.certain else UNCERTAIN_SD) * found.total
    return normal_cdf((limit - found.total) / sd)


def reference_may_fit(config: TuneConfig, trials: Sequence[TrialResult], default_batch: int,
                      device_bytes: int) -> bool:
    """Whether an fp32 reference may fit the device, given the trials so far: not where a
    certain estimate puts it past the device, nor an uncertain one with under NOT_FITTING's
    chance (fp32 at twice the batch of a fully checkpointed reference, estimated at three times
    an H100's memory from it, ran out of memory in 5 s: a Qwen2.5-0.5B shape), nor, before any
    trial measured a peak (the baseline ran out of memory), where the model's shapes and the
    parameters its worker counted already put it past the device (that estimate falls short of
    a measured peak more often than not: an fp32 1.5B Llama, 59.8 GiB estimated, 91.6 GiB
    measured)."""
    found = estimate_or_none(config, trials, default_batch)
    if found is not None:
        return found.total <= device_bytes if found.certain else \
            chance_within(found, device_bytes) >= NOT_FITTING
    counted = next((r for r in trials if parameter_count([r])), None)
    prior = prior_estimate(config, counted, default_batch) if counted else None
    return prior is None or prior.total <= device_bytes


class Footprint:
    """Estimates of the peak for one search, kept until a new trial is measured."""

    def __init__(self, history: History, default_batch: int, budget_bytes: int | None,
                 device_bytes: int | None = None) -> None:
        self.history = history
        self.default_batch = default_batch
        self.budget_bytes = budget_bytes
        self.device_bytes = device_bytes
        """What the device holds (None: unknown): an out-of-memory trial needed more."""

    def estimate(self, config: TuneConfig) -> MemoryEstimate | None:
        # (the trials read once, and each configuration estimated once, per history version)
        cache: dict[str, MemoryEstimate | None] = self.history.derived(
            ("memory estimates", self.default_batch), dict)
        key = config_key(config)
        if key not in cache:
            try:
                measured = self.history.derived(
                    ("memory trials", self.default_batch),
                    lambda: Measured(self.history.all(), self.default_batch))
                cache[key] = measured.estimate(config)
            except Exception:  # an estimate that cannot be made says nothing, never stops a search
                cache[key] = None
        return cache[key]

    def chance_to_fit(self, config: TuneConfig) -> float:
        """1 without a budget; 0.5 where nothing is known yet; less where a configuration
        that would hold about as much ran out of memory (`_after_ooms`)."""
        after_ooms = self._after_ooms(config)
        if self.budget_bytes is None:
            return after_ooms
        found = self.estimate(config)
        if found is None or found.total <= 0:
            return 0.5 * after_ooms
        return chance_within(found, self.budget_bytes) * after_ooms

    def _after_ooms(self, config: TuneConfig) -> float:
        """A configuration that ran out of memory needed more than the device holds: one whose
        estimate is about as large (within 3%) does too (a chance under NOT_FITTING's 2%, so it
        is not tried), one 10% smaller fits even odds, one 15% smaller most likely. An estimate
        of the trial that ran out below what the device holds is wrong, by at least that much:
        the device's memory stands in for it (manual attention's scores, missing from the
        estimate of a baseline that ran out, had kept every configuration of as much memory as
        the baseline's estimate from being tried on a device that held them)."""
        mine = None
        chance = 1.0
        for r in self.history.all():
            if r.status != "oom":
                continue
            try:
                out = r.tune_config
            except Exception:
                continue
            if out.parallel != config.parallel or out.devices != config.devices:
                continue
            theirs = self.estimate(out)
            mine = self.estimate(config) if mine is None else mine
            if theirs is None or mine is None or theirs.total <= 0:
                continue
            ratio = mine.total / max(theirs.total, self.device_bytes or 0)
            chance = min(chance, normal_cdf((0.9 - ratio) / OOM_RATIO_SD))
        return chance

    def bytes(self, config: TuneConfig) -> int | None:
        found = self.estimate(config)
        return found.total if found is not None else None

"""The fp32 eager reference that every configuration's losses are checked against.

One place for what the worker, `bench` and `tune` each need to know about it: how many steps are
compared, which configurations compute the reference themselves, what a reference is keyed by,
and which configurations can stand in for it. Torch-free (the parent processes use it).
"""

from __future__ import annotations

from functools import lru_cache

from strategies import registry
from strategies.config import TuneConfig

LOSS_CHECK_STEPS = 8
"""Losses compared with the reference, from the first step on."""


@lru_cache(maxsize=8192)  # (the search asks it of every row, after every trial)
def computes_reference(config: TuneConfig) -> bool:
    """Computes what the fp32 eager reference computes (every option at a value its
    `SearchFacts.reference` lists: attention, the optimizer's implementation, checkpointing,
    micro-batches and a CPU-offloaded fp32 AdamW change how, not what), so its own losses are
    the reference. A group's losses are checked against one process instead."""
    return registry.computes_reference(dict(config.values))


def reference_key(config: TuneConfig, default_batch: int) -> tuple[int, float]:
    """Batch size and gradient clipping: both change the losses a configuration must match."""
    return (config.batch_size or default_batch, config.grad_clip)


def reference_configs(config: TuneConfig) -> tuple[TuneConfig, ...]:
    """The configurations that compute `config`'s reference, in the order to try them: plain,
    then with full checkpointing, then also one sample at a time (both recompute or accumulate,
    but compute the same losses), where the one before does not fit."""
    plain = TuneConfig.reference(config.batch_size).replace(grad_clip=config.grad_clip)
    checkpointed = plain.replace(checkpointing="full")
    return plain, checkpointed, checkpointed.replace(micro_batch_size=1)


def check_losses(losses, reference, tolerance: float) -> tuple[bool | None, float | None]:
    """The first losses against the reference's: (within `tolerance` relatively at every step,
    the worst relative difference); (None, None) where there is nothing to compare."""
    n = min(len(losses), len(reference), LOSS_CHECK_STEPS)
    if n == 0:
        return None, None
    worst = max(abs(losses[i] - reference[i]) / abs(reference[i]) for i in range(n))
    return worst <= tolerance, worst

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
    then with full checkpointing, then also accumulating micro-batches of half the batch, a
    quarter and so on down to one sample at a time (each recomputes or accumulates, but computes
    the same losses), where the one before does not fit. The halvings keep the reference at the
    largest micro-batch that fits: GPT-2's at batch 128, run one sample at a time, took 28 s of
    a 9-minute search on an H100, 4.7 s a step where the whole batch checkpointed took 1.4 s at
    batch 64."""
    plain = TuneConfig.reference(config.batch_size).replace(grad_clip=config.grad_clip)
    checkpointed = plain.replace(checkpointing="full")
    batch = config.batch_size or 0
    micros = [batch >> k for k in range(1, batch.bit_length()) if batch % (batch >> k) == 0]
    if batch != 1 and 1 not in micros:  # (batch 0: the default, not known here)
        micros.append(1)
    return plain, checkpointed, *(checkpointed.replace(micro_batch_size=m) for m in micros)


def check_losses(losses, reference, tolerance: float) -> tuple[bool | None, float | None]:
    """The first losses against the reference's: (within `tolerance` relatively at every step,
    the worst relative difference); (None, None) where there is nothing to compare."""
    n = min(len(losses), len(reference), LOSS_CHECK_STEPS)
    if n == 0:
        return None, None
    worst = max(abs(losses[i] - reference[i]) / abs(reference[i]) for i in range(n))
    return worst <= tolerance, worst

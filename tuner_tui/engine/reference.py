"""The fp32 eager reference that every configuration's losses are checked against.

One place for what the worker, `bench` and `tune` each need to know about it: how many steps are
compared, which configurations compute the reference themselves, what a reference is keyed by,
and which configurations can stand in for it. Torch-free (the parent processes use it).
"""

from __future__ import annotations

from strategies.config import TuneConfig

LOSS_CHECK_STEPS = 8
"""Losses compared with the reference, from the first step on."""


def computes_reference(config: TuneConfig) -> bool:
    """Computes what the fp32 eager reference computes (attention, optimizer implementation,
    checkpointing, micro-batches and a CPU-offloaded fp32 AdamW change how, not what), so its own
    losses are the reference. A group's losses are checked against one process instead."""
    return (config.precision == "fp32" and config.compile_mode == "off"
            and not config.fused_kernels and config.weights == "fp32" and config.fp8 == "off"
            and config.optimizer_state in ("fp32", "offload") and config.parallel == "none")


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

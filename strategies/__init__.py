"""gputune's strategies: the configuration, its registry, and `apply()`. Scripts reach them
through the `gputune` module (`gputune.load`, `gputune.apply`); the same calls here:

    import strategies
    tuned = strategies.apply(strategies.load("gputune.toml"), model, optimizer)
    with tuned.autocast():
        loss = loss_fn(tuned.model(x), y)
    tuned.step(loss)   # backward (scaled for fp16), gradient clipping, optimizer step, zero_grad

With micro-batches: `for part in tuned.micro_batches(batch): ... tuned.backward(loss)`, then
`tuned.step()`. The optimizer is tuned in place when only its implementation changes; bf16
weights and low-precision or offloaded state replace it by torchao's, built on the same param
groups, and every LR scheduler made on it before `apply` is pointed at the new one: a scheduler
keeps setting the rate of `tuned.optimizer`, the optimizer that steps, in every mode.

Importing this package does not import torch; `apply` does.
"""

from strategies.config import ConfigError, ExportedConfig, TuneConfig, load, read, save
from strategies.registry import OPTIONS, STRATEGIES, Capabilities, Option, Strategy


def apply(config, model, optimizer=None, **kwargs):
    """Apply `config` to `model` (and tune or replace `optimizer`) in the fixed order of
    `strategies.compose.APPLY_ORDER`: precision, weights, attention, kernel swap, float8,
    checkpointing, data parallel, compile, optimizer. Returns a `TunedRun`."""
    from strategies.compose import apply as _apply

    return _apply(config, model, optimizer, **kwargs)


__all__ = [
    "Capabilities",
    "ConfigError",
    "ExportedConfig",
    "OPTIONS",
    "Option",
    "STRATEGIES",
    "Strategy",
    "TuneConfig",
    "apply",
    "load",
    "read",
    "save",
]

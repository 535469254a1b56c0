"""gputune's strategies: the configuration, its registry, and `apply()`.

In your own training script (at most five lines):

    import strategies
    tuned = strategies.apply(strategies.load("gputune.toml"), model, optimizer)
    model = tuned.model
    with tuned.autocast():
        loss = loss_fn(model(x), y)
    tuned.step(loss)   # backward (scaled for fp16), gradient clipping, optimizer step, zero_grad

With micro-batches: `for part in tuned.micro_batches(batch): ... tuned.backward(loss)`, then
`tuned.step()`. Use `tuned.optimizer` afterwards: bf16 weights and low-precision or offloaded
state replace the optimizer by torchao's.

Importing this package does not import torch; `apply` does.
"""

from strategies.config import ConfigError, ExportedConfig, TuneConfig, load, read, save
from strategies.registry import OPTIONS, STRATEGIES, Capabilities, Option, Strategy


def apply(config, model, optimizer=None, **kwargs):
    """Apply `config` to `model` (and rebuild `optimizer`) in the fixed order precision, weights,
    attention, kernel swap, float8, checkpointing, compile, optimizer. Returns a `TunedRun`; see
    strategies.compose."""
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

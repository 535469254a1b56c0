"""gputune, as a training script imports it.

    import gputune
    tuned = gputune.apply(gputune.load("gputune.toml"), model, optimizer)
    for x, y in batches:
        with tuned.autocast():
            loss = loss_fn(tuned.model(x), y)
        tuned.step(loss)  # backward, clipping, optimizer step, zero_grad

- `load`, `read`, `save`, `TuneConfig`: the configuration a run exported (`gputune.toml`);
- `apply`: its choices made on your model and optimizer, in a fixed order (`strategies.compose`);
  an LR scheduler made before it keeps driving the optimizer that steps;
- `hf_training_arguments`, `accelerate_config`, `lightning_trainer`, `export`: the same
  configuration as the files other trainers read (`strategies.exports`);
- `Workload`: your own model for `gputune bench --workload module:function`.

The parts live where they always did (`strategies/`, `tuner_tui/`, `kernels/` installed as
`gputune_kernels`); this module names the public ones. Importing it does not import torch;
`apply` and `Workload` do.
"""

from strategies import ConfigError, ExportedConfig, TuneConfig, apply, load, read, save
from strategies.exports import (
    TRAINER_FORMATS,
    accelerate_config,
    hf_training_arguments,
    lightning_trainer,
)
from strategies.exports import write as export
from tuner_tui import __version__


def __getattr__(name: str):
    # Workload's module imports torch: only when it is asked for.
    if name == "Workload":
        from tuner_tui.engine.workloads import Workload

        return Workload
    raise AttributeError(f"module 'gputune' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "ExportedConfig",
    "TRAINER_FORMATS",
    "TuneConfig",
    "Workload",
    "__version__",
    "accelerate_config",
    "apply",
    "export",
    "hf_training_arguments",
    "lightning_trainer",
    "load",
    "read",
    "save",
]

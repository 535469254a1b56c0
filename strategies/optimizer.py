"""AdamW implementation: plain (a loop of per-tensor kernels), foreach (batched over tensors)
or fused (one kernel).

The rule for the user's optimizer: a choice that only changes how it steps is made on the
optimizer the user passed, in place (its param groups and defaults get the new flags), so an LR
scheduler made before `apply` keeps driving the optimizer that steps. A choice that needs another
optimizer class replaces it: then `TunedRun.optimizer` is new, `report["optimizer"]["replaced"]`
is True, and a scheduler must be made after `apply`, on `tuned.optimizer`.
"""

from __future__ import annotations

import inspect

import torch

from strategies.config import ConfigError

# Optimizers whose constructor takes both `foreach` and `fused`.
_SUPPORTED = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)


def implementation_flags(choice: str) -> dict:
    return {
        "plain": {"foreach": False, "fused": False},
        "foreach": {"foreach": True, "fused": False},
        "fused": {"foreach": False, "fused": True},
    }[choice]


def set_implementation(optimizer: torch.optim.Optimizer, flags: dict) -> None:
    """Give `optimizer` the implementation `flags` in place, before its first step.

    A throwaway optimizer of the same class is built from the same groups first, so the
    constructor's own checks (fused needs floating-point parameters on a supported device, not
    differentiable) refuse what it would refuse."""
    groups = [{**group, **flags} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in {**optimizer.defaults, **flags}.items() if k in accepted and k != "params"}
    probe = type(optimizer)(groups, **settings)
    for group in optimizer.param_groups:
        group.update(flags)
    optimizer.defaults.update(flags)
    # GradScaler hands a fused optimizer its scale instead of unscaling the gradients first.
    optimizer._step_supports_amp_scaling = getattr(probe, "_step_supports_amp_scaling", False)


def has_lr_scheduler(optimizer: torch.optim.Optimizer) -> bool:
    """Whether an LR scheduler was made on `optimizer` (schedulers wrap its `step`); a strategy
    that replaces the optimizer can say the scheduler would keep driving the old one."""
    return hasattr(optimizer.step, "_wrapped_by_lr_sched")


def apply(run, config) -> None:
    optimizer = run.optimizer
    if optimizer is None:
        run.report["optimizer"] = {"changed": False, "replaced": False, "reason": "no optimizer given"}
        return
    if not isinstance(optimizer, _SUPPORTED):
        run.report["optimizer"] = {
            "changed": False,
            "replaced": False,
            "reason": f"{type(optimizer).__name__} has no foreach/fused choice; left as is",
        }
        return
    if any(optimizer.state.values()):
        raise ConfigError(
            "optimizer already has state: call strategies.apply before the first optimizer step"
        )
    flags = implementation_flags(config.optimizer)
    set_implementation(optimizer, flags)
    run.report["optimizer"] = {"changed": True, "replaced": False, "type": type(optimizer).__name__, **flags}

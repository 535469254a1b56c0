"""AdamW implementation: plain (a loop of per-tensor kernels), foreach (batched over tensors)
or fused (one kernel). The user's optimizer is rebuilt with the same parameter groups and
hyper-parameters; only the implementation flags change."""

from __future__ import annotations

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


def apply(run, config) -> None:
    optimizer = run.optimizer
    if optimizer is None:
        run.report["optimizer"] = {"rebuilt": False, "reason": "no optimizer given"}
        return
    if not isinstance(optimizer, _SUPPORTED):
        run.report["optimizer"] = {
            "rebuilt": False,
            "reason": f"{type(optimizer).__name__} has no foreach/fused choice; left as is",
        }
        return
    if any(optimizer.state.values()):
        raise ConfigError(
            "optimizer already has state: call strategies.apply before the first optimizer step"
        )
    flags = implementation_flags(config.optimizer)
    groups = [{**group, **flags} for group in optimizer.param_groups]
    run.optimizer = type(optimizer)(groups)
    run.report["optimizer"] = {"rebuilt": True, "type": type(optimizer).__name__, **flags}

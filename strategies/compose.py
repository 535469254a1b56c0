"""`apply()`: compose the strategies on a model and optimizer, in the registry's order.

The result, `TunedRun`, is what a training loop needs: the model, the optimizer, the autocast
context and a `step(loss)` that does backward (scaled for fp16), clipping, the optimizer step
and zero_grad. gputune's own trainer uses exactly this path, so what is measured is what users
get.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from strategies.config import ConfigError, TuneConfig
from strategies.registry import STRATEGIES


@dataclass
class TunedRun:
    config: TuneConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    device_type: str
    autocast_dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    report: dict[str, Any] = field(default_factory=dict)
    """What each strategy did, keyed by strategy name (counts of swapped modules, ...)."""
    blocks: list[nn.Module] | None = None
    """The repeated blocks to checkpoint or compile one by one; None: found automatically."""
    after_backward: Callable[[nn.Module], None] | None = None
    """Called with the model once the gradients are complete (unscaled), before clipping and
    the optimizer step: gputune's trainer checks the first step's gradients here."""

    def repeated_blocks(self) -> list[nn.Module]:
        from strategies.blocks import find_blocks

        return list(self.blocks) if self.blocks is not None else find_blocks(self.model)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def step(self, loss: torch.Tensor) -> None:
        """Backward, unscale and clip, optimizer step, zero_grad."""
        if self.optimizer is None:
            raise ConfigError("TunedRun.step needs an optimizer: pass one to strategies.apply")
        clip = self.config.grad_clip
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if clip > 0 or self.after_backward is not None:
                self.scaler.unscale_(self.optimizer)
            if self.after_backward is not None:
                self.after_backward(self.model)
            if clip > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if self.after_backward is not None:
                self.after_backward(self.model)
            if clip > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _device_type(model: nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply(
    config: TuneConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    device_type: str | None = None,
    blocks: list[nn.Module] | None = None,
) -> TunedRun:
    """Apply every strategy of `config` to `model` (in place) and rebuild `optimizer`.

    Order: precision, attention, fused kernels, activation checkpointing, compile, optimizer.
    `blocks` names the model's repeated blocks for checkpointing and per-block compile; by
    default they are found (the largest list of same-type modules).
    Raises ConfigError when a choice cannot run on the model's device.
    """
    if not isinstance(config, TuneConfig):
        raise ConfigError(f"strategies.apply needs a TuneConfig, not {type(config).__name__}")
    run = TunedRun(config, model, optimizer, device_type or _device_type(model), blocks=blocks)
    for strategy in STRATEGIES:
        if strategy.module is None:
            continue
        module = importlib.import_module(strategy.module)
        module.apply(run, config)
    return run

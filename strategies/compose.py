"""`apply()`: compose the strategies on a model and optimizer, in the order of `APPLY_ORDER`.

The result, `TunedRun`, is what a training loop needs: the model, the optimizer (rebuilt, or
replaced by torchao's for bf16 weights and low-precision or offloaded state), the autocast
context, `micro_batches(batch)` and `backward(loss)` for gradient accumulation, and a
`step(loss)` that does backward (scaled for fp16), clipping, the optimizer step and zero_grad.
gputune's own trainer uses exactly this path, so what is measured is what users get.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from strategies import (
    accumulation,
    attention,
    checkpointing,
    data_parallel,
    float8,
    fused_kernels,
    precision,
    weights,
)
from strategies import compile as compile_  # (the names `compile` and `optimizer` are taken)
from strategies import optimizer as optimizer_
from strategies.config import ConfigError, TuneConfig


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
    accumulation_steps: int = 1
    """Micro-batches per optimizer step, set by `micro_batches`; `backward` divides by it."""
    micro_backwards: int = 0
    """Backward passes since `micro_batches` split the current batch."""
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

    def micro_batches(self, batch: Any) -> list:
        """`batch` split along its first dim into batch_size / micro_batch_size equal parts
        (tensors inside tuples, lists and dicts are split; other values are shared), and the
        number of parts kept for `backward`. With micro_batch_size = 0: `[batch]`."""
        size = _batch_len(batch)
        if size is None:
            raise ConfigError("micro_batches: the batch holds no tensor to split")
        count = self.config.accumulation_steps(size)
        self.accumulation_steps = count
        self.micro_backwards = 0
        if count == 1:
            return [batch]
        part = size // count
        return [_take(batch, size, i * part, part) for i in range(count)]

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss, divided by the number of micro-batches, so that the
        accumulated gradients are those of the whole batch's mean loss (for losses that are
        means over equal-sized micro-batches); scaled for fp16."""
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()
        self.micro_backwards += 1
        if (self.accumulation_steps > 1 and self.micro_backwards == 1
                and self.config.compile_mode == "reduce-overhead"):
            self._own_gradients()

    def _own_gradients(self) -> None:
        """Under CUDA graphs the first micro-batch's gradients are the graph's output buffers,
        which the next micro-batch's replay overwrites before they are added to (PyTorch stops
        with "accessing tensor output of CUDAGraphs that has been overwritten"; seen on an H200
        with torch 2.11). A copy of each makes them ours; later micro-batches add into it."""
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad = p.grad.clone()

    def step(self, loss: torch.Tensor | None = None, *, zero_grad: bool = True) -> None:
        """Backward of `loss` (if given; else `backward` was called per micro-batch), unscale
        and clip, optimizer step, zero_grad."""
        if self.optimizer is None:
            raise ConfigError("TunedRun.step needs an optimizer: pass one to strategies.apply")
        if loss is not None:
            self.backward(loss)
        clip = self.config.grad_clip
        if self.scaler is not None and (clip > 0 or self.after_backward is not None):
            self.scaler.unscale_(self.optimizer)
        if self.after_backward is not None:
            self.after_backward(self.model)
        if clip > 0:
            from strategies.optimizer import clip_gradients

            clip_gradients(self.optimizer, self.model.parameters(), clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if zero_grad:
            self.zero_grad()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


def _batch_len(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (tuple, list)) or isinstance(batch, dict):
        for item in items:
            size = _batch_len(item)
            if size is not None:
                return size
    return None


def _take(batch: Any, size: int, start: int, length: int) -> Any:
    """Rows start:start+length of every tensor in `batch` whose first dim is the batch's."""
    if isinstance(batch, torch.Tensor):
        return batch[start:start + length] if batch.dim() and batch.shape[0] == size else batch
    if isinstance(batch, dict):
        return {k: _take(v, size, start, length) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        parts = [_take(v, size, start, length) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    return batch


def _device_type(model: nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


APPLY_ORDER: tuple[tuple[str, Callable], ...] = (
    # dtypes first: the autocast policy, then the parameters cast (before anything wraps them)
    ("precision", precision.apply),
    ("weights", weights.apply),
    # module swaps, on the plain model
    ("attention", attention.apply),
    ("fused_kernels", fused_kernels.apply),
    ("float8", float8.apply),
    # wrappers: checkpointing inside data parallelism, compile around both
    ("checkpointing", checkpointing.apply),
    ("data_parallel", data_parallel.apply),
    ("compile", compile_.apply),
    # last: the optimizer must see the final parameters (bf16, sharded by FSDP2)
    ("optimizer", optimizer_.apply),
)
"""Each registry strategy (`registry.STRATEGIES`) by name with its `apply(run, config)`, in
the order they are applied (a test keeps the names and order those of the registry)."""


INAPPLICABLE_CHECKS: tuple[Callable, ...] = (
    attention.inapplicable,
    fused_kernels.inapplicable,
    float8.inapplicable,
    checkpointing.inapplicable,
    compile_.inapplicable,
)
"""Each strategy's `inapplicable(model, blocks)`, for the strategies whose options may find
nothing to change in a model."""


CHANGES_TRAINING_CHECKS: tuple[Callable, ...] = (accumulation.changes_training,)
"""Each `changes_training(model, blocks)`: the options whose values other than the default
train this model differently, beyond rounding (the gradient gate refuses them)."""


def changes_training(model: nn.Module, blocks: list[nn.Module] | None = None) -> dict[str, str]:
    """The options that would change how `model` trains, each with the reason (keys as
    `strategies.applicability` describes them). Reads the model only."""
    found: dict[str, str] = {}
    for check in CHANGES_TRAINING_CHECKS:
        found.update(check(model, blocks))
    return found


def inapplicable(model: nn.Module, blocks: list[nn.Module] | None = None) -> dict[str, str]:
    """The options and choices that change nothing in `model`, each with the reason (keys as
    `strategies.applicability` describes them). `blocks` as for `apply` (None: found
    automatically). Reads the model only, so a copy on the meta device will do."""
    if blocks is None:
        from strategies.blocks import find_blocks

        blocks = find_blocks(model)
    found: dict[str, str] = {}
    for check in INAPPLICABLE_CHECKS:
        found.update(check(model, blocks))
    return found


def apply(
    config: TuneConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    device_type: str | None = None,
    blocks: list[nn.Module] | None = None,
) -> TunedRun:
    """Apply every strategy of `config` to `model` and `optimizer` (in place where it can).

    Order: precision, weights, attention, fused kernels (with the loss of Hugging Face causal
    LMs), float8, activation checkpointing, data parallel (DDP or FSDP2, which need a
    torch.distributed process group), compile, optimizer.
    `blocks` names the model's repeated blocks for checkpointing and per-block compile; by
    default they are found (the largest list of same-type modules).
    Raises ConfigError when a choice cannot run on the model's device.
    """
    if not isinstance(config, TuneConfig):
        raise ConfigError(f"strategies.apply needs a TuneConfig, not {type(config).__name__}")
    run = TunedRun(config, model, optimizer, device_type or _device_type(model), blocks=blocks)
    for _, apply_strategy in APPLY_ORDER:
        apply_strategy(run, config)
    return run

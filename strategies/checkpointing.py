"""Activation checkpointing: recompute a block's activations in the backward pass instead of
keeping them. full: every block; every-n: one block in n; selective: keep the outputs of
matmuls and attention (expensive to recompute) and recompute the rest (norms, activations,
elementwise), which saves much of the memory for little of the time.

Blocks keep their names (the block's `forward` is wrapped, the module is not replaced), so
state_dict keys do not change.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def checkpoint_block(block: torch.nn.Module, selective: bool) -> None:
    inner = block.forward
    context_fn = _selective_context if selective else None

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        if context_fn is None:
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    block.forward = forward


def inapplicable(model, blocks) -> dict[str, str]:
    if blocks:
        return {}
    why = "no repeated blocks (a workload can name its blocks)"
    return {"checkpointing": why, "checkpoint_every": why}


def apply(run, config) -> None:
    if config.checkpointing == "off":
        run.report["checkpointing"] = {"blocks": 0}
        return
    blocks = run.repeated_blocks()
    if not blocks:
        run.report["checkpointing"] = {"blocks": 0, "reason": "no repeated blocks found"}
        return
    every = config.checkpoint_every if config.checkpointing == "every-n" else 1
    chosen = [b for i, b in enumerate(blocks) if i % every == 0]
    for block in chosen:
        checkpoint_block(block, selective=config.checkpointing == "selective")
    run.report["checkpointing"] = {
        "blocks": len(chosen),
        "of": len(blocks),
        "policy": config.checkpointing,
    }

"""Scaled, causally masked softmax for manual attention: scale + mask + softmax in one pass.

``causal_softmax(scores, scale)`` takes attention scores (..., T, T) before scaling and returns
softmax(scale * scores) over the last dim with keys j > i masked out. The forward reads only
the unmasked triangle and writes zeros above it; the backward reads y and dy on the triangle.
The kernels are those of ``kernels.softmax`` run with ``CAUSAL=True``.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from kernels import _common
from kernels.softmax import launch_bwd, launch_fwd


@triton_op("gputune::causal_softmax", mutates_args={})
def _causal_softmax_op(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return launch_fwd(scores, scale, scores.shape[-2], True)


@triton_op("gputune::causal_softmax_backward", mutates_args={})
def _causal_softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, scale: float) -> torch.Tensor:
    return launch_bwd(y, dy, scale, y.shape[-2], True)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _causal_softmax_backward_op(y, dy, ctx.scale), None


_causal_softmax_op.register_autograd(_backward, setup_context=_setup_context)


def causal_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * scores) over the last dim, keys j > i masked; scores is (..., T, T)."""
    _common.check_float("causal_softmax", "scores", scores)
    if scores.dim() < 2 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(
            f"causal_softmax: scores must have shape (..., T, T) (square in the last two dims), "
            f"got {tuple(scores.shape)}"
        )
    if isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise TypeError(f"causal_softmax: scale must be a Python float, got {type(scale).__name__}")
    return _causal_softmax_op(scores, float(scale))

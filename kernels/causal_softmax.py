"""Scaled, causally masked softmax for manual attention: scale + mask + softmax in one pass.

``causal_softmax(scores, scale)`` takes attention scores (..., T, T) before scaling and returns
softmax(scale * scores) over the last dim with keys j > i masked out. The forward reads only
the unmasked triangle and writes zeros above it; the backward reads y and dy on the triangle.
The kernels are those of ``gputune_kernels.softmax`` run with ``CAUSAL=True``.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from gputune_kernels import _common
from gputune_kernels.softmax import launch_bwd, launch_fwd


def _causal_softmax_impl(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return launch_fwd(scores, scale, scores.shape[-2], True)


def _causal_softmax_backward_impl(y: torch.Tensor, dy: torch.Tensor, scale: float) -> torch.Tensor:
    return launch_bwd(y, dy, scale, y.shape[-2], True)


_causal_softmax_op = triton_op("gputune::causal_softmax", mutates_args={})(_causal_softmax_impl)
_causal_softmax_backward_op = triton_op("gputune::causal_softmax_backward", mutates_args={})(
    _causal_softmax_backward_impl
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    dx = _common.call_backward(_causal_softmax_backward_op, _causal_softmax_backward_impl, y, dy, ctx.scale)
    return dx, None


_causal_softmax_op.register_autograd(_backward, setup_context=_setup_context)
_CausalSoftmaxFunction = _common.eager_function(
    "_CausalSoftmaxFunction", _causal_softmax_impl, _setup_context, _backward
)


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
    return _common.call(_causal_softmax_op, _CausalSoftmaxFunction, _causal_softmax_impl, scores, float(scale))

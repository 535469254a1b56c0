"""Cross-entropy over the last dim of logits: forward and backward Triton kernels.

Memory design: the forward walks each row once with an online logsumexp and saves only the
per-row logsumexp (fp32, one number a row) besides the logits it already holds; it never
builds a softmax or log-softmax buffer. The backward writes (softmax - onehot) * grad_row
straight into the gradient tensor autograd needs anyway, reading each logit once more. So the
only full-size tensor this op ever allocates is the logits' gradient itself. The reduction
('mean' over non-ignored rows, 'sum', 'none') is plain torch on the per-row losses, so every
reduction shares one backward kernel. Losses are fp32 whatever the logits' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch

#: Block the kernels walk a row of logits with.
_BLOCK = 8192


@triton.jit
def _cross_entropy_fwd_kernel(
    logits_ptr, target_ptr, loss_ptr, lse_ptr, n_cols, ignore_index, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=-float("inf")).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new), axis=0)
        m = m_new
    lse = (m + tl.log2(s)) * 0.6931471805599453  # back to natural log
    tgt = tl.load(target_ptr + row).to(tl.int64)
    valid = tgt != ignore_index
    x_t = tl.load(x_row + tgt, mask=valid & (tgt >= 0) & (tgt < n_cols), other=0.0).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - x_t, 0.0))
    tl.store(lse_ptr + row, lse)


@triton.jit
def _cross_entropy_bwd_kernel(
    logits_ptr, target_ptr, lse_ptr, grad_row_ptr, dx_ptr, n_cols, ignore_index, BLOCK: tl.constexpr,
):
    # d loss_row / d x = softmax(x) - onehot(target); zero for ignored rows.
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * n_cols
    dx_row = dx_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    tgt = tl.load(target_ptr + row).to(tl.int64)
    g = tl.load(grad_row_ptr + row).to(tl.float32)
    g = tl.where(tgt != ignore_index, g, 0.0)
    lse2 = tl.load(lse_ptr + row) * 1.4426950408889634
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=0.0).to(tl.float32)
        p = tl.exp2(x * 1.4426950408889634 - lse2)
        dx = (p - tl.where(c == tgt, 1.0, 0.0)) * g
        tl.store(dx_row + c, dx.to(dx_ptr.dtype.element_ty), mask=c < n_cols)


def _warps(n_cols: int) -> tuple[int, int]:
    block = min(_BLOCK, triton.next_power_of_2(int(n_cols)))
    return block, _common.warps_for(block)


def _cross_entropy_impl(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    x = _common.rows_of(logits)
    rows, n_cols = x.shape
    target = target.contiguous()
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows > 0 and not _common.tracing_interpreted(x):
        block, warps = _warps(n_cols)
        _launch.of(_cross_entropy_fwd_kernel)[(rows,)](
            x, target, loss, lse, n_cols, ignore_index, BLOCK=block, num_warps=warps
        )
    return loss, lse


def _cross_entropy_backward_impl(
    logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, grad_rows: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    x = _common.rows_of(logits)
    rows, n_cols = x.shape
    grad_rows = grad_rows.to(torch.float32).contiguous()  # from a sum() it arrives expanded (stride 0)
    dx = torch.empty_like(x)
    if rows > 0 and not _common.tracing_interpreted(x):
        block, warps = _warps(n_cols)
        _launch.of(_cross_entropy_bwd_kernel)[(rows,)](
            x, target.contiguous(), lse, grad_rows, dx, n_cols, ignore_index, BLOCK=block, num_warps=warps
        )
    return dx.view(logits.shape)


_cross_entropy_op = triton_op("gputune::cross_entropy", mutates_args={})(_cross_entropy_impl)
_cross_entropy_backward_op = triton_op("gputune::cross_entropy_backward", mutates_args={})(
    _cross_entropy_backward_impl
)


def _setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # lse gets no gradient: build no zeros for it
    logits, target, ignore_index = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_loss, _grad_lse):
    logits, target, lse = ctx.saved_tensors
    dx = _common.call_backward(
        _cross_entropy_backward_op, _cross_entropy_backward_impl, logits, target, lse, grad_loss, ctx.ignore_index
    )
    return dx, None, None


_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)
_CrossEntropyFunction = _common.eager_function(
    "_CrossEntropyFunction", _cross_entropy_impl, _setup_context, _backward
)


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of logits (..., V) against class indices target (...); the loss is fp32.

    'mean' averages over rows whose target is not ignore_index (nan when all are ignored, as
    torch does); 'none' returns one loss per row, shaped like target. Targets outside
    [0, V) other than ignore_index are not checked (checking needs a device sync).
    """
    _common.check_float("cross_entropy", "logits", logits)
    if logits.dim() == 0:
        raise ValueError("cross_entropy: logits must have shape (..., V), got a 0-dim tensor")
    rows = logits.numel() // max(logits.shape[-1], 1)
    _common.check_target("cross_entropy", target, rows, logits)
    _common.check_reduction("cross_entropy", reduction)
    loss, _ = _common.call(
        _cross_entropy_op, _CrossEntropyFunction, _cross_entropy_impl, logits, target.reshape(-1), int(ignore_index)
    )
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()

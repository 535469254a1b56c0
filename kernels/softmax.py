"""Softmax over the last dim: forward and backward Triton kernels, any row length.

Rows up to ``_MAX_SINGLE_BLOCK`` elements are held in registers in one block (one read, one
write). Longer rows use a looped online softmax: a first pass keeps the running max and the
running sum rescaled to it, a second pass writes exp(x - max) / sum. The same kernels serve
the causal, scaled softmax of ``gputune_kernels.causal_softmax`` (``CAUSAL=True``): a row then reads
only its first ``i + 1`` columns and writes zeros after them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch

_LOG2E = 1.4426950408889634

#: Rows longer than this take the looped (two-pass) kernel.
_MAX_SINGLE_BLOCK = 16384
#: Block the looped kernel walks a row with.
_LOOP_BLOCK = 4096


@triton.jit
def _softmax_fwd_kernel(
    x_ptr, y_ptr, n_rows, n_cols, seq_len, scale,
    CAUSAL: tl.constexpr, SINGLE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    # exp(s*x - m) computed as exp2((s*log2e)*x - m2): one multiply per element.
    k = scale * 1.4426950408889634
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        # ROWS whole rows per program (short rows would leave a program too little to do).
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        if CAUSAL:
            limit = (rows % seq_len) + 1  # query i attends to keys 0..i
        else:
            limit = tl.zeros([ROWS], tl.int64) + n_cols
        offs = rows[:, None] * n_cols + cols[None, :]
        live = rows[:, None] < n_rows
        x = tl.load(x_ptr + offs, mask=live & (cols[None, :] < limit[:, None]), other=-float("inf"))
        x = x.to(tl.float32) * k
        # Rows past n_rows are all -inf: keep their max and sum finite (their stores are masked).
        m = tl.maximum(tl.max(x, axis=1), -1e30)
        e = tl.exp2(x - m[:, None])
        d = tl.sum(e, axis=1)
        y = e / tl.where(d > 0, d, 1.0)[:, None]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=live & (cols[None, :] < n_cols))
    else:
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * n_cols
        y_row = y_ptr + row * n_cols
        if CAUSAL:
            limit = (row % seq_len) + 1
        else:
            limit = n_cols
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.zeros([], tl.float32)
        for start in range(0, limit, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < limit, other=-float("inf")).to(tl.float32) * k
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new), axis=0)
            m = m_new
        inv = 1.0 / s
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < limit, other=-float("inf")).to(tl.float32) * k
            y = tl.exp2(x - m) * inv
            tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=c < n_cols)


@triton.jit
def _softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, seq_len, scale,
    CAUSAL: tl.constexpr, SINGLE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    # dx = scale * y * (dy - sum(dy * y)); masked positions have y = 0, so dx = 0 there.
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        if CAUSAL:
            limit = (rows % seq_len) + 1
        else:
            limit = tl.zeros([ROWS], tl.int64) + n_cols
        offs = rows[:, None] * n_cols + cols[None, :]
        live = rows[:, None] < n_rows
        mask = live & (cols[None, :] < limit[:, None])
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dot = tl.sum(y * dy, axis=1)
        dx = scale * y * (dy - dot[:, None])
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=live & (cols[None, :] < n_cols))
    else:
        row = tl.program_id(0).to(tl.int64)
        y_row = y_ptr + row * n_cols
        dy_row = dy_ptr + row * n_cols
        dx_row = dx_ptr + row * n_cols
        if CAUSAL:
            limit = (row % seq_len) + 1
        else:
            limit = n_cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, limit, BLOCK):
            c = start + cols
            y = tl.load(y_row + c, mask=c < limit, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + c, mask=c < limit, other=0.0).to(tl.float32)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            y = tl.load(y_row + c, mask=c < limit, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + c, mask=c < limit, other=0.0).to(tl.float32)
            dx = scale * y * (dy - dot)
            tl.store(dx_row + c, dx.to(dx_ptr.dtype.element_ty), mask=c < n_cols)


#: A program of the single-block kernel takes whole rows up to about this many elements.
_ELEMENTS_PER_PROGRAM = 4096


def _blocking(n_cols: int) -> tuple[bool, int, int, int]:
    """(single block?, rows per program, block, warps) for rows of n_cols elements."""
    if n_cols <= _MAX_SINGLE_BLOCK:
        block = triton.next_power_of_2(int(n_cols))
        rows = max(1, min(64, _ELEMENTS_PER_PROGRAM // block))
        return True, rows, block, _common.warps_for(rows * block)
    block = min(_LOOP_BLOCK, triton.next_power_of_2(int(n_cols)))
    return False, 1, block, _common.warps_for(block)


def launch_fwd(x: torch.Tensor, scale: float, seq_len: int, causal: bool) -> torch.Tensor:
    """y = softmax(scale * x) over the last dim (causally masked when `causal`)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    n_cols = x.shape[-1] if x.dim() else 1
    rows = x.numel() // max(n_cols, 1)
    if rows == 0 or n_cols == 0 or _common.tracing_interpreted(x):
        return y
    single, per_program, block, warps = _blocking(n_cols)
    _launch.of(_softmax_fwd_kernel)[(_common.cdiv(rows, per_program),)](
        x, y, rows, n_cols, seq_len, scale,
        CAUSAL=causal, SINGLE=single, ROWS=per_program, BLOCK=block, num_warps=warps,
    )
    return y


def launch_bwd(y: torch.Tensor, dy: torch.Tensor, scale: float, seq_len: int, causal: bool) -> torch.Tensor:
    """Gradient of softmax(scale * x) given its output y and the output's gradient dy."""
    y = y.contiguous()
    dy = dy.contiguous()  # grads of y.sum() arrive expanded (stride 0)
    dx = torch.empty_like(y)
    n_cols = y.shape[-1] if y.dim() else 1
    rows = y.numel() // max(n_cols, 1)
    if rows == 0 or n_cols == 0 or _common.tracing_interpreted(y):
        return dx
    single, per_program, block, warps = _blocking(n_cols)
    _launch.of(_softmax_bwd_kernel)[(_common.cdiv(rows, per_program),)](
        y, dy, dx, rows, n_cols, seq_len, scale,
        CAUSAL=causal, SINGLE=single, ROWS=per_program, BLOCK=block, num_warps=warps,
    )
    return dx


def _softmax_impl(x: torch.Tensor) -> torch.Tensor:
    return launch_fwd(x, 1.0, 1, False)


def _softmax_backward_impl(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return launch_bwd(y, dy, 1.0, 1, False)


_softmax_op = triton_op("gputune::softmax", mutates_args={})(_softmax_impl)
_softmax_backward_op = triton_op("gputune::softmax_backward", mutates_args={})(_softmax_backward_impl)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _common.call_backward(_softmax_backward_op, _softmax_backward_impl, y, dy)


_softmax_op.register_autograd(_backward, setup_context=_setup_context)
_SoftmaxFunction = _common.eager_function("_SoftmaxFunction", _softmax_impl, _setup_context, _backward)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x) along `dim` (fp32 accumulation; output in x's dtype)."""
    _common.check_float("softmax", "x", x)
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dim, got a 0-dim tensor")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"softmax: dim must be in [{-x.dim()}, {x.dim() - 1}] for x of shape {tuple(x.shape)}, got {dim}"
        )
    dim = dim % x.dim()
    if dim == x.dim() - 1:
        return _common.call(_softmax_op, _SoftmaxFunction, _softmax_impl, x)
    return _common.call(_softmax_op, _SoftmaxFunction, _softmax_impl, x.movedim(dim, -1)).movedim(-1, dim)

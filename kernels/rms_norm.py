"""RMSNorm over the last dim: forward and backward Triton kernels with the weight grad.

y = x / sqrt(mean(x^2) + eps) * weight. The forward keeps one row per program in registers
and saves 1/rms (fp32). The backward runs a persistent grid: each program walks rows
``pid, pid + P, ...``, writes dx and sums its share of dweight in fp32 registers; _partial_sums
adds the P partial sums and writes dweight in the weight's dtype (by a second small kernel, or
by torch's sum: its MODE). A forward and backward is three launches and no torch compute op
(in the "kernel" mode).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch, _native, _partial_sums


@triton.jit
def _rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_part_ptr, n_rows, n_cols, n_programs,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, n_rows, n_programs):
        off = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd
        wdy = dy * w
        c = tl.sum(xhat * wdy, axis=0) / n_cols
        dx = (wdy - xhat * c) * rstd
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)


def _rms_norm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    rows, n_cols = _common.row_count(x), x.shape[-1]
    y = torch.empty_like(x)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows > 0 and not _common.tracing_interpreted(x):
        block, warps = _common.row_params(n_cols)
        _launch.of(_rms_norm_fwd_kernel)[(rows,)](
            x, weight.contiguous(), y, rstd, n_cols, eps, BLOCK=block, num_warps=warps
        )
    return y, rstd


def _rms_norm_backward_impl(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    dy = dy.contiguous()  # grads of y.sum() arrive expanded (stride 0)
    rows, n_cols = _common.row_count(x), x.shape[-1]
    dx = torch.empty_like(x)
    dw = torch.empty(n_cols, dtype=weight.dtype, device=x.device)
    programs = _common.program_count(x.device)
    # Every program stores its row of partial sums (zeros when it had no rows): no zero fill.
    part = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
    if n_cols > 0 and not _common.tracing_interpreted(x):
        block, warps = _common.row_params(n_cols)
        _launch.of(_rms_norm_bwd_kernel)[(programs,)](
            dy, x, weight.contiguous(), rstd, dx, part, rows, n_cols, programs, BLOCK=block, num_warps=warps,
        )
        _partial_sums.add(part, dw)
    return dx, dw


_rms_norm_op = triton_op("gputune::rms_norm", mutates_args={})(_rms_norm_impl)
_rms_norm_backward_op = triton_op("gputune::rms_norm_backward", mutates_args={})(_rms_norm_backward_impl)


def _setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # rstd gets no gradient: build no zeros for it
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _common.call_backward(_rms_norm_backward_op, _rms_norm_backward_impl, dy, x, weight, rstd)
    return dx, dw, None


_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)
_RMSNormFunction = _common.eager_function("_RMSNormFunction", _rms_norm_impl, _setup_context, _backward)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of x over its last dim: x / sqrt(mean(x^2) + eps) * weight.

    weight=None (nn.RMSNorm(elementwise_affine=False)) means a weight of ones.
    """
    if (
        not torch.compiler.is_compiling() and _native.ENABLED and _native.entry is not None
        and _partial_sums.MODE == "kernel"
    ):
        y = _native.entry.rms_norm(x, weight, eps)  # the C++ node, or None
        if y is not None:
            return y
    _common.check_float("rms_norm", "x", x)
    if x.dim() == 0:
        raise ValueError("rms_norm: x must have at least one dim, got a 0-dim tensor")
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    _common.check_norm_weight("rms_norm", "weight", weight, x)
    _common.check_row_len("rms_norm", x.shape[-1])
    if _native.applies("rms_norm", x, weight, float(eps)):
        kernels = _native_kernels(x, weight, _common.row_count(x), x.shape[-1])
        if kernels is not None:
            y = _native.run("rms_norm", kernels, x, weight, float(eps))
            if y is not None:
                return y
    return _common.call(_rms_norm_op, _RMSNormFunction, _rms_norm_impl, x, weight, float(eps))[0]


# The C++ node's kernels per (device, dtypes, row length, row-count class): a list, or None
# where it cannot run them.
_NATIVE_KERNELS: dict = {}


def _native_kernels(x: torch.Tensor, weight: torch.Tensor, rows: int, n_cols: int):
    key = (x.device.index, x.dtype, weight.dtype, n_cols, _native.int_class(rows), _partial_sums.MODE)
    if key not in _NATIVE_KERNELS:
        block, warps = _common.row_params(n_cols)
        programs = _common.program_count(x.device)
        rows = 16 if _native.int_class(rows) else 17  # a row count of the same class
        f32 = torch.float32
        _NATIVE_KERNELS[key] = _native.kernel_list(
            _native.compiled(_rms_norm_fwd_kernel, "ppppif", x.dtype, weight.dtype, x.dtype, f32, n_cols, 1e-6,
                             BLOCK=block, num_warps=warps),
            _native.compiled(_rms_norm_bwd_kernel, "ppppppiii", x.dtype, x.dtype, weight.dtype, f32, x.dtype, f32,
                             rows, n_cols, programs, BLOCK=block, num_warps=warps),
            _partial_sums.compiled(weight.dtype, programs, n_cols, two=False),
            programs, _partial_sums.BLOCK_COLS,
        )
    return _NATIVE_KERNELS[key]

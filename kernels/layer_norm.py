"""LayerNorm over the last dim: forward and backward Triton kernels with weight and bias grads.

The forward keeps one row per program in registers and saves the row's mean and 1/std (fp32,
in one (2, rows) buffer). The backward runs a persistent grid: each program walks rows
``pid, pid + P, ...``, writes dx for each, and sums its share of dweight and dbias in fp32
registers; _partial_sums adds the P partial sums and writes both grads in the weight's dtype
(by a second small kernel, or by torch's sum: its MODE). x, dy and dx cross device memory once
each; a forward and backward is three launches and no torch compute op (in the "kernel" mode),
as few host calls as eager torch's own LayerNorm.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch, _native, _partial_sums


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, stats_ptr, n_rows, n_cols, eps,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(stats_ptr + row, mean)
    tl.store(stats_ptr + n_rows + row, rstd)


@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, part_ptr, n_rows, n_cols, n_programs,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, n_rows, n_programs):
        off = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(stats_ptr + row)
        rstd = tl.load(stats_ptr + n_rows + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = dy * w
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        if HAS_BIAS:
            db += dy
    # part is (1 or 2, n_programs, n_cols): dweight's partial sums, then dbias's.
    tl.store(part_ptr + pid * n_cols + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(part_ptr + (n_programs + pid) * n_cols + cols, db, mask=mask)


def _layer_norm_impl(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    rows, n_cols = _common.row_count(x), x.shape[-1]
    y = torch.empty_like(x)
    stats = torch.empty((2, rows), dtype=torch.float32, device=x.device)  # mean, 1/std
    if rows > 0 and not _common.tracing_interpreted(x):
        block, warps = _common.row_params(n_cols)
        has_bias = bias is not None
        _launch.of(_layer_norm_fwd_kernel)[(rows,)](
            x, weight.contiguous(), bias.contiguous() if has_bias else weight, y, stats, rows, n_cols, eps,
            HAS_BIAS=has_bias, BLOCK=block, num_warps=warps,
        )
    return y, stats


def _layer_norm_backward_impl(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stats: torch.Tensor, has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    dy = dy.contiguous()  # grads of y.sum() arrive expanded (stride 0)
    rows, n_cols = _common.row_count(x), x.shape[-1]
    dx = torch.empty_like(x)
    dw = torch.empty(n_cols, dtype=weight.dtype, device=x.device)
    db = torch.empty(n_cols if has_bias else 0, dtype=weight.dtype, device=x.device)
    programs = _common.program_count(x.device)
    # Every program stores its row of partial sums (zeros when it had no rows): no zero fill.
    shape = (2, programs, n_cols) if has_bias else (programs, n_cols)
    part = torch.empty(shape, dtype=torch.float32, device=x.device)
    if n_cols > 0 and not _common.tracing_interpreted(x):
        block, warps = _common.row_params(n_cols)
        _launch.of(_layer_norm_bwd_kernel)[(programs,)](
            dy, x, weight.contiguous(), stats, dx, part, rows, n_cols, programs,
            HAS_BIAS=has_bias, BLOCK=block, num_warps=warps,
        )
        _partial_sums.add(part, dw, db if has_bias else None)
    return dx, dw, db


_layer_norm_op = triton_op("gputune::layer_norm", mutates_args={})(_layer_norm_impl)
_layer_norm_backward_op = triton_op("gputune::layer_norm_backward", mutates_args={})(_layer_norm_backward_impl)


def _setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # the stats get no gradient: build no zeros for them
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    dx, dw, db = _common.call_backward(
        _layer_norm_backward_op, _layer_norm_backward_impl, dy, x, weight, stats, has_bias
    )
    if has_bias and db.dtype != ctx.bias_dtype:  # a bias in another dtype than the weight
        db = db.to(ctx.bias_dtype)
    return dx, dw, (db if has_bias else None), None


_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)
_LayerNormFunction = _common.eager_function("_LayerNormFunction", _layer_norm_impl, _setup_context, _backward)


def layer_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm of x over its last dim: (x - mean) / sqrt(var + eps) * weight (+ bias).

    weight=None (nn.LayerNorm(elementwise_affine=False)) means a weight of ones.
    """
    if (
        not torch.compiler.is_compiling() and _native.ENABLED and _native.entry is not None
        and _partial_sums.MODE == "kernel"
    ):
        y = _native.entry.layer_norm(x, weight, bias, eps)  # the C++ node, or None
        if y is not None:
            return y
    _common.check_float("layer_norm", "x", x)
    if x.dim() == 0:
        raise ValueError("layer_norm: x must have at least one dim, got a 0-dim tensor")
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    _common.check_norm_weight("layer_norm", "weight", weight, x)
    if bias is not None:
        _common.check_norm_weight("layer_norm", "bias", bias, x)
    _common.check_row_len("layer_norm", x.shape[-1])
    if _native.applies("layer_norm", x, weight, bias, float(eps)):
        kernels = _native_kernels(x, weight, bias is not None, _common.row_count(x), x.shape[-1])
        if kernels is not None:
            y = _native.run("layer_norm", kernels, x, weight, bias, float(eps))
            if y is not None:
                return y
    return _common.call(_layer_norm_op, _LayerNormFunction, _layer_norm_impl, x, weight, bias, float(eps))[0]


# The C++ node's kernels per (device, dtypes, bias, row length, row-count class): a list, or
# None where it cannot run them.
_NATIVE_KERNELS: dict = {}


def _native_kernels(x: torch.Tensor, weight: torch.Tensor, has_bias: bool, rows: int, n_cols: int):
    key = (x.device.index, x.dtype, weight.dtype, has_bias, n_cols, _native.int_class(rows), _partial_sums.MODE)
    if key not in _NATIVE_KERNELS:
        block, warps = _common.row_params(n_cols)
        programs = _common.program_count(x.device)
        rows = 16 if _native.int_class(rows) else 17  # a row count of the same class
        f32, w = torch.float32, weight.dtype
        _NATIVE_KERNELS[key] = _native.kernel_list(
            _native.compiled(_layer_norm_fwd_kernel, "pppppiif", x.dtype, w, w, x.dtype, f32, rows, n_cols, 1e-5,
                             HAS_BIAS=has_bias, BLOCK=block, num_warps=warps),
            _native.compiled(_layer_norm_bwd_kernel, "ppppppiii", x.dtype, x.dtype, w, f32, x.dtype, f32,
                             rows, n_cols, programs, HAS_BIAS=has_bias, BLOCK=block, num_warps=warps),
            _partial_sums.compiled(w, programs, n_cols, two=has_bias),
            programs, _partial_sums.BLOCK_COLS,
        )
    return _NATIVE_KERNELS[key]

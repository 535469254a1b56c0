"""SwiGLU gate: silu(a) * b, forward and backward as flat elementwise Triton kernels.

The backward recomputes sigmoid(a) from a instead of saving it, so the forward saves nothing
new: it reads a, b and writes y; the backward reads a, b, dy and writes da, db.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch, _native

_BLOCK = 4096


@triton.jit
def _swiglu_fwd_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    # d silu / da = sig * (1 + a * (1 - sig))
    da = dy * b * sig * (1.0 + a * (1.0 - sig))
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dy * silu).to(db_ptr.dtype.element_ty), mask=mask)


def _swiglu_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a = a.contiguous()
    b = b.contiguous()
    y = torch.empty_like(a)
    n = a.numel()
    if n > 0 and not _common.tracing_interpreted(a):
        _launch.of(_swiglu_fwd_kernel)[(_common.cdiv(n, _BLOCK),)](a, b, y, n, BLOCK=_BLOCK, num_warps=8)
    return y


def _swiglu_backward_impl(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dy = dy.contiguous()  # grads of y.sum() arrive expanded (stride 0)
    a = a.contiguous()
    b = b.contiguous()
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    n = a.numel()
    if n > 0 and not _common.tracing_interpreted(a):
        _launch.of(_swiglu_bwd_kernel)[(_common.cdiv(n, _BLOCK),)](dy, a, b, da, db, n, BLOCK=_BLOCK, num_warps=8)
    return da, db


_swiglu_op = triton_op("gputune::swiglu", mutates_args={})(_swiglu_impl)
_swiglu_backward_op = triton_op("gputune::swiglu_backward", mutates_args={})(_swiglu_backward_impl)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    a, b = ctx.saved_tensors
    return _common.call_backward(_swiglu_backward_op, _swiglu_backward_impl, dy, a, b)


_swiglu_op.register_autograd(_backward, setup_context=_setup_context)
_SwigluFunction = _common.eager_function("_SwigluFunction", _swiglu_impl, _setup_context, _backward)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b elementwise (fp32 inside; output in a's dtype)."""
    if not torch.compiler.is_compiling() and _native.ENABLED and _native.entry is not None:
        y = _native.entry.swiglu(a, b)  # the C++ node, or None
        if y is not None:
            return y
    _common.check_float("swiglu", "a", a)
    _common.check_float("swiglu", "b", b)
    _common.check_same_device("swiglu", "a", a, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"swiglu: a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"swiglu: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if _native.applies("swiglu", a, b):
        kernels = _native_kernels(a, a.numel())
        if kernels is not None:
            y = _native.run("swiglu", kernels, a, b)
            if y is not None:
                return y
    return _common.call(_swiglu_op, _SwigluFunction, _swiglu_impl, a, b)


# The C++ node's kernels per (device, dtype, size class): a list, or None where it cannot run them.
_NATIVE_KERNELS: dict = {}


def _native_kernels(a: torch.Tensor, n: int):
    key = (a.device.index, a.dtype, _native.int_class(n))
    if key not in _NATIVE_KERNELS:
        t = a.dtype
        _NATIVE_KERNELS[key] = _native.kernel_list(
            _native.compiled(_swiglu_fwd_kernel, "pppi", t, t, t, n, BLOCK=_BLOCK, num_warps=8),
            _native.compiled(_swiglu_bwd_kernel, "pppppi", t, t, t, t, t, n, BLOCK=_BLOCK, num_warps=8),
            _BLOCK,
        )
    return _NATIVE_KERNELS[key]

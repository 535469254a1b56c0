"""GELU with the tanh approximation, forward and backward as flat elementwise Triton kernels.

y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). tanh(u) is computed as
2 sigmoid(2u) - 1, which stays finite for large |u|. The backward recomputes u from x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch, _native

_BLOCK = 4096


@triton.jit
def _gelu_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    u = tl.minimum(tl.maximum(u, -20.0), 20.0)  # tanh is +-1 in fp32 past 10; keeps exp finite
    t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
    tl.store(y_ptr + offs, (0.5 * x * (1.0 + t)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    u = tl.minimum(tl.maximum(u, -20.0), 20.0)  # tanh is +-1 in fp32 past 10; keeps exp finite
    t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
    du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
    tl.store(dx_ptr + offs, (dy * grad).to(dx_ptr.dtype.element_ty), mask=mask)


def _gelu_impl(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n > 0 and not _common.tracing_interpreted(x):
        _launch.of(_gelu_fwd_kernel)[(_common.cdiv(n, _BLOCK),)](x, y, n, BLOCK=_BLOCK, num_warps=8)
    return y


def _gelu_backward_impl(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dy = dy.contiguous()  # grads of y.sum() arrive expanded (stride 0)
    x = x.contiguous()
    dx = torch.empty_like(x)
    n = x.numel()
    if n > 0 and not _common.tracing_interpreted(x):
        _launch.of(_gelu_bwd_kernel)[(_common.cdiv(n, _BLOCK),)](dy, x, dx, n, BLOCK=_BLOCK, num_warps=8)
    return dx


_gelu_op = triton_op("gputune::gelu_tanh", mutates_args={})(_gelu_impl)
_gelu_backward_op = triton_op("gputune::gelu_tanh_backward", mutates_args={})(_gelu_backward_impl)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return _common.call_backward(_gelu_backward_op, _gelu_backward_impl, dy, x)


_gelu_op.register_autograd(_backward, setup_context=_setup_context)
_GeluFunction = _common.eager_function("_GeluFunction", _gelu_impl, _setup_context, _backward)


# The C++ node's kernels per (device, dtype, size class): a list, or None where it cannot run them.
_NATIVE_KERNELS: dict = {}


def _native_kernels(x: torch.Tensor, n: int):
    key = (x.device.index, x.dtype, _native.int_class(n))
    if key not in _NATIVE_KERNELS:
        _NATIVE_KERNELS[key] = _native.kernel_list(
            _native.compiled(_gelu_fwd_kernel, "ppi", x.dtype, x.dtype, n, BLOCK=_BLOCK, num_warps=8),
            _native.compiled(_gelu_bwd_kernel, "pppi", x.dtype, x.dtype, x.dtype, n, BLOCK=_BLOCK, num_warps=8),
            _BLOCK,
        )
    return _NATIVE_KERNELS[key]


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (torch's gelu(approximate='tanh'))."""
    if not torch.compiler.is_compiling() and _native.ENABLED and _native.entry is not None:
        y = _native.entry.gelu_tanh(x)  # the C++ node, or None
        if y is not None:
            return y
    _common.check_float("gelu_tanh", "x", x)
    if _native.applies("gelu_tanh", x):
        kernels = _native_kernels(x, x.numel())
        if kernels is not None:
            y = _native.run("gelu_tanh", kernels, x)
            if y is not None:
                return y
    return _common.call(_gelu_op, _GeluFunction, _gelu_impl, x)

"""Checks and helpers shared by the kernel launchers (torch only, no Triton)."""

from __future__ import annotations

import os

import torch
from torch._library import triton as _torch_triton
from torch.utils._python_dispatch import _get_current_dispatch_mode

#: dtypes the kernels compute in (fp32 accumulation inside for all of them).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Longest row (elements) the single-block row kernels (norms) take.
MAX_NORM_ROW = 65536


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(op: str, name: str, t: torch.Tensor) -> None:
    if t.is_cuda:  # cheaper than t.device, which builds a device object
        return
    if t.device.type == "cpu" and interpreting():
        return
    allowed = "a CUDA tensor" + (" (or a CPU tensor under TRITON_INTERPRET=1)")
    raise ValueError(f"{op}: {name} must be {allowed}, got a tensor on {t.device}")


def check_float(op: str, name: str, t: torch.Tensor, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    check_device(op, name, t)
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: {name} must have dtype in ({names}), got {t.dtype}")


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; both must be on one device")


def check_target(op: str, target: torch.Tensor, rows: int, ref: torch.Tensor) -> None:
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{op}: target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: target must have dtype int64 or int32 (class indices), got {target.dtype}")
    check_same_device(op, "the input", ref, "target", target)
    if target.numel() != rows:
        raise ValueError(f"{op}: target must hold one class index per row ({rows}), got shape {tuple(target.shape)}")


def check_reduction(op: str, reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def check_norm_weight(op: str, name: str, w: torch.Tensor, x: torch.Tensor) -> None:
    check_float(op, name, w)
    check_same_device(op, "x", x, name, w)
    if w.dim() != 1 or w.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: {name} must have shape ({x.shape[-1]},) to match the last dim of x {tuple(x.shape)}, "
            f"got {tuple(w.shape)}"
        )


def check_row_len(op: str, n: int, limit: int = MAX_NORM_ROW) -> None:
    if n > limit:
        raise ValueError(f"{op}: the last dim of x is {n}; at most {limit} elements per row are supported")


def rows_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous (rows, last_dim) view of t (copies only when t is not contiguous)."""
    return t.contiguous().view(-1, t.shape[-1]) if t.dim() > 0 else t.contiguous().view(1, 1)


def row_count(t: torch.Tensor) -> int:
    """Rows of t over its last dim, without building a view (each view costs a microsecond or two)."""
    n_cols = t.shape[-1]
    return t.numel() // n_cols if n_cols else 0


def cdiv(n: int, d: int) -> int:
    """ceil(n / d) for grids: newer Tritons make triton.cdiv a constexpr function, a few
    microseconds a call on the host."""
    return -(-n // d)


_ROW_PARAMS: dict[int, tuple[int, int]] = {}


def row_params(n_cols: int) -> tuple[int, int]:
    """(block, warps) for a single-block row kernel, cached per row length.

    Under torch.compile with dynamic shapes n_cols arrives as a SymInt, which cannot key a dict:
    int() specializes it (the block is a compile-time constant of the kernel anyway)."""
    n_cols = int(n_cols)
    params = _ROW_PARAMS.get(n_cols)
    if params is None:
        block = 1 << max(0, n_cols - 1).bit_length()  # next power of 2
        params = _ROW_PARAMS[n_cols] = (block, warps_for(block))
    return params


def warps_for(block: int) -> int:
    """Warps per program for a row block of `block` elements."""
    if block >= 16384:
        return 16
    if block >= 4096:
        return 8
    if block >= 1024:
        return 4
    return 2


def program_count(device: torch.device) -> int:
    """Programs for a persistent grid: 4 per multiprocessor on CUDA, 4 interpreted.

    It does not depend on the number of rows (programs past the last row store zero partial
    sums), so that a compiled graph with a dynamic batch size does not specialize on it.
    """
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _PROGRAMS.get(index)
    if count is None:
        count = _PROGRAMS[index] = 4 * torch.cuda.get_device_properties(index).multi_processor_count
    return count


_PROGRAMS: dict[int, int] = {}


def tracing_interpreted(t: torch.Tensor) -> bool:
    """True when t is a fake (tracing) tensor and the kernels run interpreted.

    Compiled kernels are traced by torch.library.wrap_triton, but under TRITON_INTERPRET=1
    wrap_triton hands back the raw interpreted kernel, which would read a fake tensor's data.
    The launchers then skip the launch: tracing needs only the outputs' shapes and dtypes.
    """
    if type(t) in _PLAIN_TENSORS or not interpreting():
        return False
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, (FakeTensor, FunctionalTensor))


# ---- eager fast path ----------------------------------------------------------------------
# A call through the custom op in eager mode pays the op's Python dispatch (autograd wrapper,
# redispatch, dynamo.disable) on top of the kernel launch: measured on the H200 machine, about
# 0.5 ms per forward+backward, more than the whole GPU time of a norm at 8192x4096. So eager
# calls on plain tensors go through an autograd.Function that runs the same implementation
# with the raw Triton kernels; tracing (torch.compile, export, fake or functional tensors,
# dispatch modes) goes through the custom op, which the compiler sees through.

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def fast_path(args) -> bool:
    """True when args can skip the custom op: eager, no dispatch mode, plain tensors only."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False  # vmap / grad wrap tensors the raw kernels cannot read
    if _get_current_dispatch_mode() is not None:
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN_TENSORS or _functorch_wrapped(a)):
            return False  # a subclass, or a tensor that outlived its vmap or grad (no storage)
    return True


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


class _RawTriton:
    """set_wrap_triton_enabled(False) without contextlib's generator (a few us per call)."""

    __slots__ = ("prev",)

    def __enter__(self):
        self.prev = _torch_triton.is_wrap_triton_enabled()
        _torch_triton.wrap_triton_enabled.value = False

    def __exit__(self, *exc):
        _torch_triton.wrap_triton_enabled.value = self.prev


def raw_triton():
    """Context in which torch.library.wrap_triton hands back the plain kernel (no tracing)."""
    if hasattr(_torch_triton, "wrap_triton_enabled"):
        return _RawTriton()
    return _torch_triton.set_wrap_triton_enabled(False)


def eager_function(name, impl, setup_context, backward):
    """An autograd.Function running `impl` with raw kernels, wired like the custom op."""

    # Old-style forward(ctx, ...): a separate setup_context makes every apply() bind its
    # arguments through inspect.signature, tens of microseconds per call.
    def forward(ctx, *args):
        with raw_triton():
            output = impl(*args)
        setup_context(ctx, args, output)
        return output

    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
    })
    # Function.apply's Python wrapper, beyond the C apply under it, unwraps functorch's dead
    # wrappers (tensors that outlived their vmap or grad), which fast_path sends to the custom
    # op instead: calling the C apply saves 2-3 us a call.
    function.raw_apply = super(torch.autograd.Function, function).apply
    return function


def call(op, function, impl, *args):
    """Run a forward op: its implementation directly when no gradient can flow, the eager
    autograd.Function when one can, the custom op when tracing."""
    if fast_path(args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return function.raw_apply(*args)
        with raw_triton():
            return impl(*args)
    return op(*args)


def call_backward(op, impl, *args):
    """Run a backward op: its implementation directly when possible, else the custom op."""
    if fast_path(args):
        with raw_triton():
            return impl(*args)
    return op(*args)

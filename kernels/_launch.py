"""Launching a Triton kernel from eager code without re-binding its arguments on every call.

`kernel[grid](*args)` runs Triton's JITFunction.run each time: it binds and specializes every
argument, builds a cache key and looks the compiled kernel up, which on the H200 machine was
nearly half of a norm's host time (docs/kernels.md). A `Launcher` keeps the compiled kernel of
each specialization and calls it directly on later calls. Its key is at least as fine as Triton's
own: for each tensor its dtype and whether its data is 16-byte aligned, for each int whether
it is 1, a multiple of 16, and which integer type holds it; the constexprs and launch options by
value; the current device. So a kernel is never reused for arguments Triton would have
compiled differently.

A direct launch also hands Triton's C launcher each tensor's address as an int, which it takes
as it is (for a tensor it calls `data_ptr()` and asks the driver, cuPointerGetAttribute, whether
the address is a device pointer: our checks have already made sure), and the current stream,
which the runner would otherwise look up through Triton's driver object. Both are per-launch
host costs that the norms pay three times a forward and backward.

Under tracing (torch.compile sees the kernels through torch.library.wrap_triton), under
Triton's CPU interpreter, and with GPUTUNE_FAST_LAUNCH=0, launches go the usual way.
"""

from __future__ import annotations

import os

import torch
import triton
from torch._library import triton as _torch_triton
from torch.library import wrap_triton

_ENABLED = os.environ.get("GPUTUNE_FAST_LAUNCH", "1") != "0"
# A compiled kernel takes every parameter, the constexprs included, since Triton 3.3; before,
# only the others.
_WITH_CONSTEXPRS = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 3)
_INT32 = (-(2**31), 2**31)


def spec(value) -> tuple:
    """What Triton specializes a kernel argument on (or finer), for the arguments that
    Launcher._launch does not key itself: it takes a tensor's dtype and whether its address is
    16-byte aligned, and an int of 32 bits as one small int (1 for one, 16 for a multiple of
    16, Triton's divisibility, 0 otherwise)."""
    if isinstance(value, bool):  # before int: a bool is an int
        return ("b", value)
    if isinstance(value, int):
        return ("i", value == 1, value % 16 == 0, _INT32[0] <= value < _INT32[1], value < 2**63)
    if isinstance(value, float):
        return ("f",)
    return ("v", value)  # None and other values: by value


def _stream(device: int) -> int:
    """The current CUDA stream of `device`, as the raw handle Triton's runner takes."""
    return torch._C._cuda_getCurrentRawStream(device)


def _cuda_device(first: torch.Tensor) -> int | None:
    """The current CUDA device where the kernel's first argument is on a GPU (Triton compiles
    per current device), else None. (A CUDA tensor means CUDA is initialized: torch's own
    getter, without torch.cuda.current_device()'s lazy-init check.)"""
    return torch._C._cuda_getDevice() if first.is_cuda else None


class Launcher:
    """`Launcher(kernel)[grid](*args, **constexprs_and_options)`, like `kernel[grid](...)`."""

    __slots__ = ("kernel", "names", "passed", "all_passed", "compiled")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.names = tuple(getattr(kernel, "arg_names", ())) or None
        # Which parameters the compiled kernel takes, by position.
        params = getattr(kernel, "params", None) or ()
        self.passed = tuple(_WITH_CONSTEXPRS or not p.is_constexpr for p in params)
        if len(self.passed) != len(self.names or ()):
            self.names = None  # a kernel whose parameters we cannot read: the usual launch
        self.all_passed = all(self.passed)
        self.compiled: dict = {}

    def __getitem__(self, grid):
        if _torch_triton.is_wrap_triton_enabled():  # tracing: the compiler must see the kernel
            return wrap_triton(self.kernel)[grid]
        if not _ENABLED or self.names is None:
            return self.kernel[grid]
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args: tuple, kwargs: dict) -> None:
        device = _cuda_device(args[0])
        if device is None:
            self.kernel[grid](*args, **kwargs)
            return
        # One pass over the arguments gives the key and, for each tensor, its address. (This
        # runs for every launch: each operation here costs the host a little.)
        # A tensor adds two entries (its dtype, which nothing else adds, then its alignment),
        # anything else one.
        key, values = [device], []
        for a in args:
            if isinstance(a, torch.Tensor):
                address = a.data_ptr()
                key.append(a.dtype)
                key.append(address % 16 == 0)
                values.append(address)
            elif type(a) is int and -2147483648 <= a < 2147483648:  # _INT32, unpacked
                key.append(1 if a == 1 else (16 if a % 16 == 0 else 0))
                values.append(a)
            else:
                key.append(spec(a))
                values.append(a)
        # (keywords come in the call site's order: another order only misses the cache)
        key.extend(kwargs.items())
        key = tuple(key)
        compiled = self.compiled.get(key)
        if compiled is not None:
            # A compiled kernel's runner takes a 3-d grid and the parameters in order (what
            # JITFunction.run passes it).
            for name in self.names[len(args):]:
                values.append(kwargs[name])
            if not self.all_passed:
                values = [v for v, passed in zip(values, self.passed) if passed]
            grid3 = (grid[0], 1, 1) if len(grid) == 1 else tuple(grid) + (1,) * (3 - len(grid))
            compiled[grid3](*values, stream=_stream(device))
            return
        compiled = self.kernel[grid](*args, **kwargs)  # compiles (once) and launches
        # Kept only where every parameter is given here (a default would be bound by Triton)
        # and the compiled kernel can be launched directly.
        rest = self.names[len(args):]
        if all(name in kwargs for name in rest) and callable(getattr(compiled, "__getitem__", None)):
            self.compiled[key] = compiled


_LAUNCHERS: dict[int, Launcher] = {}


def of(kernel) -> Launcher:
    """The one Launcher of `kernel` (made on first use): `of(kernel)[grid](...)` where the
    code would write `wrap_triton(kernel)[grid](...)`."""
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is None:
        launcher = _LAUNCHERS[id(kernel)] = Launcher(kernel)
    return launcher

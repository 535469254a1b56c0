"""The direct launch path (kernels/_launch.py): a compiled kernel is reused only for arguments
that Triton would have compiled the same way, with every parameter in order."""

from types import SimpleNamespace

import pytest
import torch

import gputune_kernels
from gputune_kernels import _common, _launch, _native
from gputune_kernels.gelu import _gelu_fwd_kernel
from kernel_testing import DEVICE, assert_close, leaf, ref_leaf


class _Recorder:
    """A kernel double with JITFunction's launch surface: `kernel[grid](*args, **kw)` records a
    bound launch and returns a compiled kernel whose `[grid](*params)` records a direct one."""

    def __init__(self, arg_names):
        self.arg_names = arg_names
        self.params = [SimpleNamespace(is_constexpr=name.isupper()) for name in arg_names]
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("bound", grid, args, kwargs))
            return _Direct(self.log)

        return run


class _Direct:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *params, stream: self.log.append(("direct", grid, params, stream))


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(_launch, "_cuda_device", lambda first: 0)
    monkeypatch.setattr(_launch, "_stream", lambda device: 1234 + device)
    with _common.raw_triton():  # eager: wrap_triton hands back the plain kernel
        yield


def test_a_compiled_kernel_is_called_directly_with_every_parameter_in_order(on_gpu):
    kernel = _Recorder(("x", "n", "BLOCK"))
    launch = _launch.Launcher(kernel)
    x = torch.zeros(64)
    launch[(4,)](x, 32, BLOCK=16, num_warps=4)
    launch[(4,)](x, 32, BLOCK=16, num_warps=4)
    assert [e[0] for e in kernel.log] == ["bound", "direct"]
    # a 3-d grid, the tensor as its address (the C launcher takes an int as it is), the
    # constexpr among the parameters (the launch option is not one), the current stream
    assert kernel.log[1][1:] == ((4, 1, 1), (x.data_ptr(), 32, 16), 1234)


def test_before_triton_3_3_a_compiled_kernel_takes_no_constexprs(on_gpu, monkeypatch):
    monkeypatch.setattr(_launch, "_WITH_CONSTEXPRS", False)
    kernel = _Recorder(("x", "n", "BLOCK"))
    launch = _launch.Launcher(kernel)
    x = torch.zeros(64)
    for _ in range(2):
        launch[(4, 2)](x, 32, BLOCK=16)
    assert kernel.log[1] == ("direct", (4, 2, 1), (x.data_ptr(), 32), 1234)


def test_what_triton_specializes_on_is_never_shared(on_gpu):
    kernel = _Recorder(("x", "n", "BLOCK"))
    launch = _launch.Launcher(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, 32, BLOCK=16)
    launch[(1,)](x, 33, BLOCK=16)  # no longer a multiple of 16
    launch[(1,)](x, 1, BLOCK=16)  # one
    launch[(1,)](x, 2**31, BLOCK=16)  # a 64-bit int
    launch[(1,)](x[1:], 32, BLOCK=16)  # 4 bytes in: not 16-byte aligned
    launch[(1,)](x.double(), 32, BLOCK=16)  # another dtype
    launch[(1,)](x, 32, BLOCK=32)  # another constexpr
    launch[(1,)](x, 32, BLOCK=16, num_warps=8)  # another launch option
    assert [e[0] for e in kernel.log] == ["bound"] * 8
    launch[(1,)](x, 48, BLOCK=16)  # as the first: a multiple of 16, aligned, same dtype
    assert kernel.log[-1][0] == "direct"


def test_a_parameter_left_to_its_default_keeps_the_bound_launch(on_gpu):
    kernel = _Recorder(("x", "n", "BLOCK"))
    launch = _launch.Launcher(kernel)
    x = torch.zeros(8)
    for _ in range(2):
        launch[(1,)](x, 16)  # BLOCK from the kernel's default: Triton binds it
    assert [e[0] for e in kernel.log] == ["bound", "bound"]


def test_on_the_cpu_and_when_tracing_the_launch_goes_the_usual_way():
    kernel = _Recorder(("x",))
    with _common.raw_triton():
        _launch.Launcher(kernel)[(1,)](torch.zeros(4))
        _launch.Launcher(kernel)[(1,)](torch.zeros(4))
    assert [e[0] for e in kernel.log] == ["bound", "bound"]  # CPU tensors: nothing kept


@pytest.mark.gpu
def test_gelu_through_the_direct_launch_at_aligned_and_unaligned_addresses(poisoned, monkeypatch):
    monkeypatch.setattr(_native, "ENABLED", False)  # the Python path (else the C++ node takes x aligned)
    for offset in (0, 0, 1, 1):  # aligned twice, then 2 bytes in, twice
        big = leaf(torch.randn(4097, device=DEVICE).mul(4).to(torch.bfloat16))
        x = big[offset:offset + 4096]  # a view: the kernels get its address as it is
        y = gputune_kernels.gelu_tanh(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        xr = ref_leaf(x)
        yr = torch.nn.functional.gelu(xr, approximate="tanh")
        yr.backward(dy.to(torch.float64))
        assert_close(y, yr, torch.bfloat16, "gelu_tanh output")
        assert_close(big.grad[offset:offset + 4096], xr.grad, torch.bfloat16, "gelu_tanh grad x")
    # the direct path is in use on the GPU, with one compiled kernel per alignment of x
    # (a key is flat: the device, then x's dtype and whether its address is 16-byte aligned)
    firsts = {key[1:3] for key in _launch.of(_gelu_fwd_kernel).compiled}
    assert {(torch.bfloat16, True), (torch.bfloat16, False)} <= firsts

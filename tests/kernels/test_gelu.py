import pytest
import torch
import torch.nn.functional as F

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, device_work, leaf, ref_leaf

SHAPES = [(5, 123), (37, 781), (3, 4099)]


def _check(x, dtype, sum_grad=False):
    x = leaf(x)
    y = gputune_kernels.gelu_tanh(x)
    if sum_grad:
        y.sum().backward()
    else:
        dy = torch.randn_like(y)
        y.backward(dy)
    xr = ref_leaf(x)
    yr = F.gelu(xr, approximate="tanh")
    yr.sum().backward() if sum_grad else yr.backward(dy.to(torch.float64))
    assert y.dtype == dtype
    assert_close(y, yr, dtype, "gelu_tanh output")
    assert_close(x.grad, xr.grad, dtype, "gelu_tanh grad x")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_tanh_matches_float64_reference(shape, dtype, poisoned):
    _check(torch.randn(shape, device=DEVICE).mul(4).to(dtype), dtype)


def test_gelu_tanh_extreme_inputs_stay_finite(poisoned):
    x = torch.tensor([-1e4, -30.0, -5.0, 0.0, 5.0, 30.0, 1e4], device=DEVICE)
    _check(x, torch.float32)


def test_gelu_tanh_non_contiguous_input_and_expanded_grad(poisoned):
    _check(torch.randn(123, 5, device=DEVICE).t(), torch.float32, sum_grad=True)


def test_gelu_tanh_rejects_bad_inputs(monkeypatch):
    with pytest.raises(TypeError, match="x must have dtype"):
        gputune_kernels.gelu_tanh(torch.arange(3, device=DEVICE))
    with pytest.raises(TypeError, match="torch.Tensor"):
        gputune_kernels.gelu_tanh(3.0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        gputune_kernels.gelu_tanh(torch.randn(3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_real_sizes_gpu(dtype, poisoned):
    _check(torch.randn(8192, 11008, device="cuda").mul(4).to(dtype), dtype)


def test_gelu_tanh_forward_and_backward_are_one_launch_each_and_no_copy(monkeypatch):
    x = leaf(torch.randn(6, 33, device=DEVICE))
    dy = torch.randn(6, 33, device=DEVICE)
    launched, ops = device_work(monkeypatch, lambda: torch.autograd.grad(gputune_kernels.gelu_tanh(x), [x], dy))
    assert launched == ["_gelu_fwd_kernel", "_gelu_bwd_kernel"]
    assert ops == set()

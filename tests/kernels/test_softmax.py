import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, leaf, ref_leaf

softmax_module = sys.modules["gputune_kernels.softmax"]

# (37, 781): odd; (3, 20000): longer than one block (looped online softmax); 3-D rows.
SHAPES = [(5, 123), (37, 781), (3, 20000), (2, 3, 17)]


def _check(x, dtype, dim=-1, grad=None):
    x = leaf(x)
    y = gputune_kernels.softmax(x, dim=dim)
    dy = torch.randn_like(y) if grad is None else grad
    y.backward(dy)
    xr = ref_leaf(x)
    yr = torch.softmax(xr, dim=dim)
    yr.backward(dy.to(torch.float64))
    assert y.dtype == dtype
    assert_close(y, yr, dtype, "softmax output")
    assert_close(x.grad, xr.grad, dtype, "softmax grad x")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_matches_float64_reference(shape, dtype, poisoned):
    _check(torch.randn(shape, device=DEVICE).mul(3).to(dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_looped_path_at_small_block(dtype, poisoned, monkeypatch):
    monkeypatch.setattr(softmax_module, "_MAX_SINGLE_BLOCK", 64)
    monkeypatch.setattr(softmax_module, "_LOOP_BLOCK", 64)
    _check(torch.randn(9, 781, device=DEVICE).mul(3).to(dtype), dtype)


def test_softmax_other_dim_and_non_contiguous_input(poisoned):
    x = torch.randn(123, 7, device=DEVICE).t()  # (7, 123), not contiguous
    _check(x, torch.float32, dim=0)
    _check(x, torch.float32, dim=-1)


def test_softmax_grad_from_sum_arrives_expanded(poisoned):
    x = leaf(torch.randn(5, 123, device=DEVICE))
    gputune_kernels.softmax(x).sum().backward()  # dy has stride 0
    xr = ref_leaf(x)
    torch.softmax(xr, -1).sum().backward()
    assert_close(x.grad, xr.grad, torch.float32, "softmax grad of sum")


def test_softmax_rejects_bad_inputs(monkeypatch):
    with pytest.raises(TypeError, match="x must have dtype"):
        gputune_kernels.softmax(torch.arange(6, device=DEVICE).view(2, 3))
    with pytest.raises(TypeError, match="x must have dtype"):
        gputune_kernels.softmax(torch.randn(2, 3, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match="dim must be in"):
        gputune_kernels.softmax(torch.randn(2, 3, device=DEVICE), dim=2)
    with pytest.raises(ValueError, match="at least one dim"):
        gputune_kernels.softmax(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(TypeError, match="torch.Tensor"):
        gputune_kernels.softmax([1.0, 2.0])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        gputune_kernels.softmax(torch.randn(2, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 4096), (16384, 1024), (512, 65536)])
def test_softmax_real_sizes_gpu(shape, dtype, poisoned):
    _check(torch.randn(shape, device="cuda").mul(3).to(dtype), dtype)


def test_softmax_under_vmap_goes_through_the_custom_op():
    x = torch.randn(3, 4, 17, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no batching rule: torch loops over the batch, and says so
        got = torch.func.vmap(gputune_kernels.softmax)(x)
    torch.testing.assert_close(got, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)


@given(rows=st.integers(1, 9), cols=st.integers(1, 300), scale=st.floats(0.1, 30.0))
@settings(max_examples=15, deadline=None)
def test_softmax_any_small_shape_matches_torch(rows, cols, scale):
    x = torch.randn(rows, cols, device=DEVICE) * scale
    torch.testing.assert_close(gputune_kernels.softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)

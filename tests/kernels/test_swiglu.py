import pytest
import torch
import torch.nn.functional as F

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, leaf, ref_leaf

SHAPES = [(5, 123), (37, 781), (3, 4099)]


def _check(a, b, dtype, sum_grad=False):
    a, b = leaf(a), leaf(b)
    y = gputune_kernels.swiglu(a, b)
    if sum_grad:
        y.sum().backward()
    else:
        dy = torch.randn_like(y)
        y.backward(dy)
    ar, br = ref_leaf(a), ref_leaf(b)
    yr = F.silu(ar) * br
    yr.sum().backward() if sum_grad else yr.backward(dy.to(torch.float64))
    assert y.dtype == dtype
    assert_close(y, yr, dtype, "swiglu output")
    assert_close(a.grad, ar.grad, dtype, "swiglu grad a")
    assert_close(b.grad, br.grad, dtype, "swiglu grad b")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_matches_float64_reference(shape, dtype, poisoned):
    _check(torch.randn(shape, device=DEVICE).mul(3).to(dtype), torch.randn(shape, device=DEVICE).to(dtype), dtype)


def test_swiglu_non_contiguous_inputs_and_expanded_grad(poisoned):
    u = torch.randn(37, 2 * 123, device=DEVICE)
    a, b = u.chunk(2, dim=-1)  # strided views, as in a fused up-projection
    _check(a, b, torch.float32, sum_grad=True)


def test_swiglu_rejects_bad_inputs(monkeypatch):
    a = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="same shape"):
        gputune_kernels.swiglu(a, torch.randn(4, 7, device=DEVICE))
    with pytest.raises(TypeError, match="same dtype"):
        gputune_kernels.swiglu(a, a.to(torch.bfloat16))
    with pytest.raises(TypeError, match="b must have dtype"):
        gputune_kernels.swiglu(a, a.to(torch.int64))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="a must be a CUDA tensor"):
        gputune_kernels.swiglu(torch.randn(2), torch.randn(2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_real_sizes_gpu(dtype, poisoned):
    shape = (8192, 11008)
    _check(torch.randn(shape, device="cuda").mul(3).to(dtype), torch.randn(shape, device="cuda").to(dtype), dtype)

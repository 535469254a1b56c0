import pytest
import torch

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, device_work, leaf, ref_leaf

SHAPES = [(5, 123), (37, 781), (2, 3, 64)]


def _reference(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _check(x, w, dtype, eps=1e-6, sum_grad=False):
    x, w = leaf(x), leaf(w)
    y = gputune_kernels.rms_norm(x, w, eps)
    if sum_grad:
        y.sum().backward()  # dy has stride 0
    else:
        dy = torch.randn_like(y)
        y.backward(dy)
    xr, wr = ref_leaf(x), ref_leaf(w)
    yr = _reference(xr, wr, eps)
    yr.sum().backward() if sum_grad else yr.backward(dy.to(torch.float64))
    assert y.dtype == x.dtype
    assert_close(y, yr, dtype, "rms_norm output")
    assert_close(x.grad, xr.grad, dtype, "rms_norm grad x")
    assert_close(w.grad, wr.grad, dtype, "rms_norm grad weight", scale=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_float64_reference(shape, dtype, poisoned):
    x = (torch.randn(shape, device=DEVICE) * 2 + 0.3).to(dtype)
    _check(x, torch.randn(shape[-1], device=DEVICE).to(dtype), dtype)


def test_rms_norm_fp32_weight_with_bf16_input(poisoned):
    _check(torch.randn(37, 781, device=DEVICE).to(torch.bfloat16), torch.randn(781, device=DEVICE), torch.bfloat16)


def test_rms_norm_non_contiguous_input_and_expanded_grad(poisoned):
    _check(torch.randn(123, 5, device=DEVICE).t(), torch.randn(123, device=DEVICE), torch.float32, sum_grad=True)


def test_rms_norm_rejects_bad_inputs(monkeypatch):
    x = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        gputune_kernels.rms_norm(x, torch.randn(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        gputune_kernels.rms_norm(x.to(torch.int32), torch.randn(8, device=DEVICE))
    with pytest.raises(ValueError, match="at least one dim"):
        gputune_kernels.rms_norm(torch.tensor(2.0, device=DEVICE), torch.randn(1, device=DEVICE))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        gputune_kernels.rms_norm(torch.randn(4, 8), torch.randn(8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8192, 4096), (1823, 781), (64, 65536)])
def test_rms_norm_real_sizes_gpu(shape, dtype, poisoned):
    _check(torch.randn(shape, device="cuda").to(dtype), torch.randn(shape[-1], device="cuda").to(dtype), dtype)


def test_rms_norm_with_no_rows_gives_zero_weight_grad():
    x, w = leaf(torch.randn(2, 0, 8, device=DEVICE)), leaf(torch.randn(8, device=DEVICE))
    gputune_kernels.rms_norm(x, w).sum().backward()
    assert torch.equal(w.grad, torch.zeros(8, device=DEVICE)) and x.grad.shape == (2, 0, 8)


def test_rms_norm_without_weight_matches_reference(poisoned):
    x = torch.randn(5, 123, device=DEVICE)
    y = gputune_kernels.rms_norm(x, None, 1e-6)
    torch.testing.assert_close(y.double(), _reference(x.double(), 1.0, 1e-6), atol=1e-5, rtol=1e-4)


def test_rms_norm_forward_and_backward_are_three_launches_and_no_torch_op(monkeypatch):
    # One forward kernel, the backward kernel and the weight-gradient reduction, nothing else.
    x, w = leaf(torch.randn(6, 33, device=DEVICE)), leaf(torch.randn(33, device=DEVICE))
    dy = torch.randn(6, 33, device=DEVICE)
    launched, ops = device_work(
        monkeypatch, lambda: torch.autograd.grad(gputune_kernels.rms_norm(x, w), [x, w], dy)
    )
    assert launched == ["_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel", "_sum_partials_kernel"]
    assert ops == set()


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_the_partial_sums_in_torch(monkeypatch, weight_dtype, poisoned):
    # The other way of adding the backward's partial sums (kernels/_partial_sums.py): the same
    # gradients, and torch's sum in place of the second kernel.
    from gputune_kernels import _partial_sums

    monkeypatch.setattr(_partial_sums, "MODE", "torch")
    x = (torch.randn(37, 781, device=DEVICE) * 2).to(torch.bfloat16)
    _check(x, torch.randn(781, device=DEVICE).to(weight_dtype), torch.bfloat16)
    xs, ws = leaf(torch.randn(6, 33, device=DEVICE)), leaf(torch.randn(33, device=DEVICE).to(weight_dtype))
    launched, ops = device_work(
        monkeypatch,
        lambda: torch.autograd.grad(gputune_kernels.rms_norm(xs, ws), [xs, ws], torch.randn(6, 33, device=DEVICE)),
    )
    assert launched == ["_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel"]
    assert "aten::sum" in ops


def test_a_tensor_that_outlived_its_grad_transform_still_goes_through(poisoned):
    # functorch leaves wrapped tensors behind when they escape torch.func.grad; they have no
    # storage, so the eager fast path must hand them to the custom op, which unwraps them.
    from torch.func import grad

    leaked = []

    def f(x):
        leaked.append(x * 2)
        return (x**2).sum()

    grad(f)(torch.randn(4, 8, device=DEVICE))
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    y = gputune_kernels.rms_norm(leaked[0], w)
    y.sum().backward()
    assert y.shape == (4, 8) and w.grad.shape == (8,)

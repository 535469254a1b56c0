import pytest
import torch
import torch.nn.functional as F

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, device_work, leaf, ref_leaf

SHAPES = [(5, 123), (37, 781), (2, 3, 64)]


def _check(x, w, b, dtype, eps=1e-5, sum_grad=False):
    x, w = leaf(x), leaf(w)
    b = leaf(b) if b is not None else None
    y = gputune_kernels.layer_norm(x, w, b, eps)
    if sum_grad:
        y.sum().backward()  # dy has stride 0
    else:
        dy = torch.randn_like(y)
        y.backward(dy)
    xr, wr = ref_leaf(x), ref_leaf(w)
    br = ref_leaf(b) if b is not None else None
    yr = F.layer_norm(xr, (x.shape[-1],), wr, br, eps)
    yr.sum().backward() if sum_grad else yr.backward(dy.to(torch.float64))
    assert y.dtype == x.dtype
    assert_close(y, yr, dtype, "layer_norm output")
    assert_close(x.grad, xr.grad, dtype, "layer_norm grad x")
    # dweight and dbias sum over all rows: allow for the longer sums.
    assert_close(w.grad, wr.grad, dtype, "layer_norm grad weight", scale=4)
    if b is not None:
        assert_close(b.grad, br.grad, dtype, "layer_norm grad bias", scale=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_float64_reference(shape, dtype, with_bias, poisoned):
    n = shape[-1]
    x = (torch.randn(shape, device=DEVICE) * 2 + 0.5).to(dtype)
    w = torch.randn(n, device=DEVICE).to(dtype)
    b = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    _check(x, w, b, dtype)


def test_layer_norm_fp32_weight_with_bf16_input(poisoned):
    x = torch.randn(37, 781, device=DEVICE).to(torch.bfloat16)
    _check(x, torch.randn(781, device=DEVICE), torch.randn(781, device=DEVICE), torch.bfloat16)


def test_layer_norm_non_contiguous_input_and_expanded_grad(poisoned):
    x = torch.randn(123, 5, device=DEVICE).t()
    _check(x, torch.randn(123, device=DEVICE), torch.randn(123, device=DEVICE), torch.float32, sum_grad=True)


def test_layer_norm_rejects_bad_inputs(monkeypatch):
    x = torch.randn(4, 8, device=DEVICE)
    w = torch.randn(8, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        gputune_kernels.layer_norm(x, torch.randn(7, device=DEVICE))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        gputune_kernels.layer_norm(x, w, torch.randn(8, 1, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        gputune_kernels.layer_norm(x.double(), w)
    with pytest.raises(TypeError, match="weight must have dtype"):
        gputune_kernels.layer_norm(x, w.to(torch.int64))
    with pytest.raises(ValueError, match="at most 65536"):
        gputune_kernels.layer_norm(torch.randn(1, 65537, device=DEVICE), torch.randn(65537, device=DEVICE))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        gputune_kernels.layer_norm(torch.randn(4, 8), torch.randn(8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8192, 4096), (1823, 781), (64, 65536)])
def test_layer_norm_real_sizes_gpu(shape, dtype, poisoned):
    n = shape[-1]
    x = torch.randn(shape, device="cuda").to(dtype)
    _check(x, torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype), dtype)


def test_layer_norm_with_no_rows_gives_zero_weight_grads():
    x = leaf(torch.randn(0, 8, device=DEVICE))
    w, b = leaf(torch.randn(8, device=DEVICE)), leaf(torch.randn(8, device=DEVICE))
    y = gputune_kernels.layer_norm(x, w, b)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(8, device=DEVICE)) and torch.equal(b.grad, torch.zeros(8, device=DEVICE))


def test_layer_norm_without_weight_matches_torch(poisoned):
    x = leaf(torch.randn(5, 123, device=DEVICE))
    y = gputune_kernels.layer_norm(x, None)
    torch.testing.assert_close(y, F.layer_norm(x.detach(), (123,)), atol=1e-5, rtol=1e-4)
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_forward_and_backward_are_three_launches_and_no_torch_op(monkeypatch, with_bias):
    # Host work per call decides the eager speed: one forward kernel, the backward kernel and
    # the weight-gradient reduction, nothing else launched.
    x, w = leaf(torch.randn(6, 33, device=DEVICE)), leaf(torch.randn(33, device=DEVICE))
    b = leaf(torch.randn(33, device=DEVICE)) if with_bias else None
    leaves = [x, w] + ([b] if with_bias else [])
    dy = torch.randn(6, 33, device=DEVICE)
    gputune_kernels.layer_norm(x, w, b)  # first call outside the count
    launched, ops = device_work(
        monkeypatch, lambda: torch.autograd.grad(gputune_kernels.layer_norm(x, w, b), leaves, dy)
    )
    assert launched == ["_layer_norm_fwd_kernel", "_layer_norm_bwd_kernel", "_sum_partials_kernel"]
    assert ops == set()


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_with_the_partial_sums_in_torch(monkeypatch, weight_dtype, with_bias, poisoned):
    # The other way of adding the backward's partial sums (kernels/_partial_sums.py): the same
    # gradients, and torch's sum in place of the second kernel.
    from gputune_kernels import _partial_sums

    monkeypatch.setattr(_partial_sums, "MODE", "torch")
    x = (torch.randn(37, 781, device=DEVICE) * 2).to(torch.bfloat16)
    w = torch.randn(781, device=DEVICE).to(weight_dtype)
    b = torch.randn(781, device=DEVICE).to(weight_dtype) if with_bias else None
    _check(x, w, b, torch.bfloat16)
    xs, ws = leaf(torch.randn(6, 33, device=DEVICE)), leaf(torch.randn(33, device=DEVICE).to(weight_dtype))
    bs = leaf(torch.randn(33, device=DEVICE).to(weight_dtype)) if with_bias else None
    leaves = [xs, ws] + ([bs] if with_bias else [])
    launched, ops = device_work(
        monkeypatch,
        lambda: torch.autograd.grad(gputune_kernels.layer_norm(xs, ws, bs), leaves, torch.randn(6, 33, device=DEVICE)),
    )
    assert launched == ["_layer_norm_fwd_kernel", "_layer_norm_bwd_kernel"]
    assert "aten::sum" in ops

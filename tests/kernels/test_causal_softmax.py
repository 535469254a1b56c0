import math
import sys

import pytest
import torch

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, leaf, ref_leaf

softmax_module = sys.modules["gputune_kernels.softmax"]

SHAPES = [(2, 3, 17, 17), (1, 1, 123, 123), (5, 5)]


def _reference(scores, scale):
    t = scores.shape[-1]
    masked = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax((scores * scale).masked_fill(masked, float("-inf")), dim=-1)


def _check(scores, dtype, scale):
    s = leaf(scores)
    y = gputune_kernels.causal_softmax(s, scale)
    dy = torch.randn_like(y)
    y.backward(dy)
    sr = ref_leaf(s)
    yr = _reference(sr, scale)
    yr.backward(dy.to(torch.float64))
    assert y.dtype == dtype
    assert_close(y, yr, dtype, "causal_softmax output")
    assert_close(s.grad, sr.grad, dtype, "causal_softmax grad scores")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_causal_softmax_matches_float64_reference(shape, dtype, poisoned):
    scores = torch.randn(shape, device=DEVICE).mul(4).to(dtype)
    _check(scores, dtype, 1 / math.sqrt(24))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_softmax_rows_longer_than_one_block(dtype, poisoned, monkeypatch):
    monkeypatch.setattr(softmax_module, "_MAX_SINGLE_BLOCK", 32)
    monkeypatch.setattr(softmax_module, "_LOOP_BLOCK", 32)
    _check(torch.randn(1, 1, 100, 100, device=DEVICE).to(dtype), dtype, 0.37)


def test_causal_softmax_non_contiguous_scores_and_expanded_grad(poisoned):
    q = torch.randn(2, 19, 8, device=DEVICE)
    scores = (q @ q.transpose(-2, -1)).transpose(-2, -1)  # not contiguous
    s = leaf(scores)
    gputune_kernels.causal_softmax(s, 0.5).sum().backward()  # dy has stride 0
    sr = ref_leaf(scores)
    _reference(sr, 0.5).sum().backward()
    assert_close(s.grad, sr.grad, torch.float32, "causal_softmax grad of sum")


def test_causal_softmax_rejects_bad_inputs(monkeypatch):
    with pytest.raises(ValueError, match=r"\(\.\.\., T, T\)"):
        gputune_kernels.causal_softmax(torch.randn(2, 3, 4, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match=r"\(\.\.\., T, T\)"):
        gputune_kernels.causal_softmax(torch.randn(4, device=DEVICE), 1.0)
    with pytest.raises(TypeError, match="scale must be a Python float"):
        gputune_kernels.causal_softmax(torch.randn(4, 4, device=DEVICE), torch.tensor(1.0))
    with pytest.raises(TypeError, match="scores must have dtype"):
        gputune_kernels.causal_softmax(torch.ones(4, 4, device=DEVICE, dtype=torch.int32), 1.0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="scores must be a CUDA tensor"):
        gputune_kernels.causal_softmax(torch.randn(4, 4), 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_softmax_real_sizes_gpu(dtype, poisoned):
    _check(torch.randn(4, 12, 1024, 1024, device="cuda").mul(4).to(dtype), dtype, 1 / 8)
    _check(torch.randn(1, 2, 4096, 4096, device="cuda").to(dtype), dtype, 1 / 8)

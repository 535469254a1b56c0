import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, leaf, ref_leaf

# (3, 20000): a row longer than one block (8192), walked in three blocks.
SHAPES = [(5, 123), (37, 781), (3, 20000)]


def _targets(rows, vocab, dtype=torch.int64, ignore_index=-100):
    t = torch.randint(0, vocab, (rows,), device=DEVICE, dtype=dtype)
    t[::4] = ignore_index  # every fourth row ignored
    return t


def _check(logits, target, dtype, reduction, ignore_index=-100, sum_grad=False):
    x = leaf(logits)
    loss = gputune_kernels.cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction)
    assert loss.dtype == torch.float32
    g = None if sum_grad else torch.randn_like(loss)
    loss.sum().backward() if sum_grad else loss.backward(g)
    xr = ref_leaf(logits)
    lr = F.cross_entropy(
        xr.reshape(-1, xr.shape[-1]), target.reshape(-1).long(), ignore_index=ignore_index, reduction=reduction
    )
    lr = lr.view(target.shape) if reduction == "none" else lr
    lr.sum().backward() if sum_grad else lr.backward(g.to(torch.float64))
    assert_close(loss, lr, dtype, f"cross_entropy loss ({reduction})")
    assert_close(x.grad, xr.grad, dtype, f"cross_entropy grad logits ({reduction})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_float64_reference(shape, dtype, reduction, poisoned):
    logits = torch.randn(shape, device=DEVICE).mul(3).to(dtype)
    _check(logits, _targets(shape[0], shape[1]), dtype, reduction)


def test_cross_entropy_leading_dims_int32_targets_and_other_ignore_index(poisoned):
    logits = torch.randn(2, 3, 50, device=DEVICE)
    target = torch.randint(0, 50, (2, 3), device=DEVICE, dtype=torch.int32)
    target[0, 1] = 7  # ignore_index=7 also drops any row whose class is 7
    _check(logits, target, torch.float32, "none", ignore_index=7)
    _check(logits, target, torch.float32, "mean", ignore_index=7)


def test_cross_entropy_non_contiguous_logits_and_expanded_grad(poisoned):
    logits = torch.randn(123, 5, device=DEVICE).t()  # (5, 123), not contiguous
    _check(logits, _targets(5, 123), torch.float32, "none", sum_grad=True)


def test_cross_entropy_all_ignored_mean_is_nan_like_torch():
    x = leaf(torch.randn(4, 9, device=DEVICE))
    loss = gputune_kernels.cross_entropy(x, torch.full((4,), -100, device=DEVICE))
    assert torch.isnan(loss)
    assert torch.isnan(F.cross_entropy(x.detach(), torch.full((4,), -100, device=DEVICE)))


def test_cross_entropy_rejects_bad_inputs(monkeypatch):
    x = torch.randn(4, 9, device=DEVICE)
    t = torch.randint(0, 9, (4,), device=DEVICE)
    with pytest.raises(TypeError, match="target must have dtype int64 or int32"):
        gputune_kernels.cross_entropy(x, t.float())
    with pytest.raises(ValueError, match=r"one class index per row \(4\)"):
        gputune_kernels.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="reduction must be"):
        gputune_kernels.cross_entropy(x, t, reduction="avg")
    with pytest.raises(TypeError, match="logits must have dtype"):
        gputune_kernels.cross_entropy(x.double(), t)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="logits must be a CUDA tensor"):
        gputune_kernels.cross_entropy(torch.randn(4, 9), torch.zeros(4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [50304, 128256])
def test_cross_entropy_real_sizes_gpu(vocab, dtype, poisoned):
    rows = 2048
    logits = torch.randn(rows, vocab, device="cuda").mul(3).to(dtype)
    _check(logits, _targets(rows, vocab), dtype, "mean")


@given(rows=st.integers(1, 9), vocab=st.integers(2, 400), ignored=st.integers(0, 3))
@settings(max_examples=15, deadline=None)
def test_cross_entropy_any_small_shape_matches_torch(rows, vocab, ignored):
    logits = torch.randn(rows, vocab, device=DEVICE) * 4
    target = torch.randint(0, vocab, (rows,), device=DEVICE)
    target[: min(ignored, rows - 1)] = -100  # keep one row that counts
    for reduction in ("mean", "none"):
        torch.testing.assert_close(
            gputune_kernels.cross_entropy(logits, target, reduction=reduction),
            F.cross_entropy(logits, target, reduction=reduction), atol=1e-5, rtol=1e-5,
        )

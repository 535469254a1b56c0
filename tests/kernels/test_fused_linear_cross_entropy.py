import pytest
import torch
import torch.nn.functional as F

import gputune_kernels
from kernel_testing import DEVICE, DTYPES, assert_close, leaf, ref_leaf


def _inputs(n, h, v, dtype, with_bias, device=DEVICE):
    hidden = torch.randn(n, h, device=device).to(dtype)
    weight = (torch.randn(v, h, device=device) / h**0.5).to(dtype)
    bias = torch.randn(v, device=device).to(dtype) if with_bias else None
    target = torch.randint(0, v, (n,), device=device)
    target[::5] = -100
    return hidden, weight, bias, target


def _check(hidden, weight, bias, target, dtype, reduction, chunk_rows=None, scale=1.0):
    h, w = leaf(hidden), leaf(weight)
    b = leaf(bias) if bias is not None else None
    loss = gputune_kernels.fused_linear_cross_entropy(h, w, target, reduction=reduction, bias=b, chunk_rows=chunk_rows)
    assert loss.dtype == torch.float32
    g = torch.rand_like(loss) + 0.5
    loss.backward(g)
    hr, wr = ref_leaf(hidden), ref_leaf(weight)
    br = ref_leaf(bias) if bias is not None else None
    lr = F.cross_entropy(F.linear(hr, wr, br), target, reduction=reduction)
    lr.backward(g.to(torch.float64))
    what = f"fused_linear_cross_entropy ({reduction}, chunk_rows={chunk_rows})"
    assert_close(loss, lr, dtype, f"{what} loss", scale)
    assert_close(h.grad, hr.grad, dtype, f"{what} grad hidden", scale)
    assert_close(w.grad, wr.grad, dtype, f"{what} grad weight", scale)
    if bias is not None:
        assert_close(b.grad, br.grad, dtype, f"{what} grad bias", scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_rows", [None, 8])
def test_fused_linear_cross_entropy_matches_float64_reference(dtype, reduction, chunk_rows, poisoned):
    # chunk_rows=8 over 37 rows: five chunks, the last one short.
    hidden, weight, bias, target = _inputs(37, 27, 781, dtype, with_bias=(chunk_rows == 8))
    # bf16 logits and a bf16 grad_weight summed over chunks: allow a little more.
    _check(hidden, weight, bias, target, dtype, reduction, chunk_rows, scale=2.0)


def test_fused_linear_cross_entropy_leading_dims(poisoned):
    hidden, weight, _, target = _inputs(12, 16, 50, torch.float32, False)
    h = leaf(hidden.view(3, 4, 16))
    loss = gputune_kernels.fused_linear_cross_entropy(h, weight, target.view(3, 4), reduction="none")
    assert loss.shape == (3, 4)
    ref = F.cross_entropy(hidden.double() @ weight.double().T, target, reduction="none").view(3, 4)
    assert_close(loss, ref, torch.float32, "fused_linear_cross_entropy 3-D loss")
    loss.sum().backward()  # expanded grad (stride 0) into the recompute path
    assert h.grad.shape == (3, 4, 16) and torch.isfinite(h.grad).all()


def test_fused_linear_cross_entropy_no_grad_computes_loss_only(poisoned):
    hidden, weight, _, target = _inputs(37, 27, 781, torch.float32, False)
    with torch.no_grad():
        loss = gputune_kernels.fused_linear_cross_entropy(hidden, weight, target)
    ref = F.cross_entropy(hidden.double() @ weight.double().T, target)
    assert_close(loss, ref, torch.float32, "fused_linear_cross_entropy no-grad loss")


def test_fused_linear_cross_entropy_under_autocast_casts_like_linear(poisoned):
    hidden, weight, _, target = _inputs(37, 27, 781, torch.float32, False)
    h, w = leaf(hidden), leaf(weight)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = gputune_kernels.fused_linear_cross_entropy(h, w, target)
    assert loss.dtype == torch.float32
    loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    ref = F.cross_entropy(hidden.bfloat16().double() @ weight.bfloat16().double().T, target)
    assert_close(loss, ref, torch.bfloat16, "fused_linear_cross_entropy autocast loss")


def test_fused_linear_cross_entropy_rejects_bad_inputs():
    hidden, weight, bias, target = _inputs(6, 8, 11, torch.float32, True)
    with pytest.raises(ValueError, match="same H"):
        gputune_kernels.fused_linear_cross_entropy(hidden, weight[:, :7], target)
    with pytest.raises(ValueError, match=r"bias must have shape \(11,\)"):
        gputune_kernels.fused_linear_cross_entropy(hidden, weight, target, bias=bias[:5])
    with pytest.raises(TypeError, match="share one dtype"):
        gputune_kernels.fused_linear_cross_entropy(hidden.bfloat16(), weight, target)
    with pytest.raises(ValueError, match=r"one class index per row \(6\)"):
        gputune_kernels.fused_linear_cross_entropy(hidden, weight, target[:2])
    with pytest.raises(ValueError, match="chunk_rows must be a positive int"):
        gputune_kernels.fused_linear_cross_entropy(hidden, weight, target, chunk_rows=0)
    with pytest.raises(ValueError, match="reduction must be"):
        gputune_kernels.fused_linear_cross_entropy(hidden, weight, target, reduction="max")


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_linear_cross_entropy_real_sizes_gpu(reduction, poisoned):
    hidden, weight, _, target = _inputs(4096, 2048, 50304, torch.bfloat16, False, device="cuda")
    _check(hidden, weight, None, target, torch.bfloat16, reduction, scale=2.0)



def test_fused_linear_cross_entropy_with_no_rows_gives_zero_grads():
    hidden, weight, _, target = _inputs(0, 8, 11, torch.float32, False)
    h, w = leaf(hidden), leaf(weight)
    gputune_kernels.fused_linear_cross_entropy(h, w, target, reduction="sum").backward()
    assert torch.equal(w.grad, torch.zeros_like(weight)) and h.grad.shape == (0, 8)


def test_chunk_rows_policy_and_its_environment_override(monkeypatch):
    from gputune_kernels.fused_linear_cross_entropy import default_chunk_rows

    monkeypatch.delenv("GPUTUNE_LCE_CHUNK_ROWS", raising=False)
    # 1 GiB of bf16 logits at a 128256 vocabulary: 4186 rows, rounded down to 4096.
    assert default_chunk_rows(8192, 128256, 2) == 4096
    assert default_chunk_rows(8192, 128256, 4) == 2048
    assert default_chunk_rows(300, 128256, 2) == 300  # one chunk of every row
    monkeypatch.setenv("GPUTUNE_LCE_CHUNK_ROWS", "3000")
    assert default_chunk_rows(8192, 128256, 2) == 2048
    assert default_chunk_rows(1000, 128256, 2) == 1000
    monkeypatch.setenv("GPUTUNE_LCE_CHUNK_ROWS", "many")
    with pytest.raises(ValueError, match="GPUTUNE_LCE_CHUNK_ROWS must be a positive integer"):
        default_chunk_rows(8192, 128256, 2)


def test_working_set_arithmetic_matches_the_h200_measurements():
    # Peaks measured on the H200 (benchmarks/results/kernels-h200-linear-ce.json, MiB), by
    # (hidden, vocab, chunk rows), for 8192 bf16 rows. The arithmetic may fall short only by the
    # caching allocator's rounding of a block (under 2 MiB).
    from gputune_kernels.fused_linear_cross_entropy import working_set_bytes

    measured = {(4096, 128256, 256): 1128.657, (4096, 128256, 4096): 2068.032, (4096, 50304, 1024): 555.282,
                (2048, 128256, 4096): 1535.032, (2048, 128256, 512): 659.032}
    for (h, v, c), mib in measured.items():
        assert 0 <= mib - working_set_bytes(8192, h, v, 2, c) / 2**20 < 2, (h, v, c)


def test_chunk_rows_for_a_memory_budget():
    from gputune_kernels.fused_linear_cross_entropy import chunk_rows_for_budget, working_set_bytes

    budget = int(1.1 * 2**30)  # the target at 8192 x 4096 -> 128256 bf16
    rows = chunk_rows_for_budget(8192, 4096, 128256, 2, budget)
    assert rows == 240 and working_set_bytes(8192, 4096, 128256, 2, rows) <= budget
    assert working_set_bytes(8192, 4096, 128256, 2, rows + 16) > budget
    assert chunk_rows_for_budget(100, 64, 1000, 4, 2**30) == 100  # all rows fit: one chunk
    with pytest.raises(ValueError, match="16 rows per chunk need"):
        chunk_rows_for_budget(8192, 4096, 128256, 2, 2**30)  # grad_weight alone is 0.98 GiB


def test_each_chunk_holds_exactly_chunk_rows_of_logits(monkeypatch):
    # The working-set arithmetic assumes one (chunk x V) logits buffer per chunk and nothing
    # else of that size: record the products the chunk loop builds.
    import importlib

    flce = importlib.import_module("gputune_kernels.fused_linear_cross_entropy")
    shapes = []
    real_mm = torch.mm

    def mm(a, b, **kw):
        out = real_mm(a, b, **kw)
        if "out" not in kw:
            shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch, "mm", mm)
    hidden, weight, _, target = _inputs(50, 8, 37, torch.float32, False)
    loss = gputune_kernels.fused_linear_cross_entropy(leaf(hidden), leaf(weight), target, chunk_rows=16)
    loss.backward()
    assert shapes == [(16, 37), (16, 37), (16, 37), (2, 37)]
    assert flce.working_set_bytes(50, 8, 37, 4, 16) == (37 * 8 + 50 * 8 + 16 * 37) * 4 + 50 * 4

"""Linear layer + cross-entropy without the full (N, V) logits: chunked over rows.

For each chunk of C rows: logits_c = hidden_c @ weight.T (+ bias) in the inputs' dtype, then
one Triton kernel takes the row's logsumexp and loss and, when gradients are wanted, writes
(softmax - onehot) * scale over logits_c in place (the chunk is ours, so no second buffer).
Then grad_hidden_c = grad_c @ weight and grad_weight += grad_c.T @ hidden_c. For 'mean' and
'sum' the gradients are computed in the forward (three matmuls in all, like an unfused linear
layer) and the backward only scales them by the incoming scalar, in place. For 'none' the
incoming gradient differs per row, so the backward recomputes each chunk (four matmuls).

Peak extra memory is grad_weight (V x H, weight dtype) + grad_hidden (N x H) + one chunk of
logits (C x V); C is `default_chunk_rows` unless `chunk_rows` is given (smaller C: less memory,
more time, as grad_weight is re-read and re-written once per chunk). grad_weight
accumulates across chunks in the weight's dtype (as the matmul's output); each chunk's product
is summed in fp32 inside the matmul.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from gputune_kernels import _common, _launch

#: Rows per chunk: a power of 2 with at most _CHUNK_BYTES of logits. Fewer chunks re-read and
#: re-write grad_weight fewer times; larger ones hold more logits. Measured inside a whole
#: llama-1b training step with torch.compile (benchmarks/results/lce-chunks-llama-1b-h200.json,
#: 8192 rows -> 128256, H 2048): 1024 rows 135.6 ms, 2048 134.2, 4096 132.5, 8192 (one chunk)
#: 133.5, compile alone 134.7 / 134.1 before and after. 1 GiB of logits is 4096 rows there.
_CHUNK_BYTES = 1024 * 1024 * 1024
_BLOCK = 8192
_CHUNK_ROWS_ENV = "GPUTUNE_LCE_CHUNK_ROWS"


@triton.jit
def _fused_linear_cross_entropy_fwd_kernel(
    logits_ptr, target_ptr, loss_ptr, scale_ptr, scale_stride, row0, n_cols, ignore_index,
    WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # logits_ptr is the chunk (C x V); target, loss and scale are indexed at row0 + row.
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=-float("inf")).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new), axis=0)
        m = m_new
    lse2 = m + tl.log2(s)
    tgt = tl.load(target_ptr + row0 + row).to(tl.int64)
    valid = tgt != ignore_index
    x_t = tl.load(x_row + tgt, mask=valid & (tgt >= 0) & (tgt < n_cols), other=0.0).to(tl.float32)
    tl.store(loss_ptr + row0 + row, tl.where(valid, lse2 * 0.6931471805599453 - x_t, 0.0))
    if WRITE_GRAD:
        g = tl.load(scale_ptr + (row0 + row) * scale_stride).to(tl.float32)
        g = tl.where(valid, g, 0.0)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < n_cols, other=0.0).to(tl.float32)
            p = tl.exp2(x * 1.4426950408889634 - lse2)
            dx = (p - tl.where(c == tgt, 1.0, 0.0)) * g
            tl.store(x_row + c, dx.to(logits_ptr.dtype.element_ty), mask=c < n_cols)


def default_chunk_rows(n_rows: int, vocab: int, itemsize: int) -> int:
    """Rows per chunk: a power of 2 with <= _CHUNK_BYTES of logits, at most n_rows.

    GPUTUNE_LCE_CHUNK_ROWS=N overrides the policy (rounded down to a power of 2, at most
    n_rows): the benchmarks use it to measure the chunk size inside a whole training step."""
    override = os.environ.get(_CHUNK_ROWS_ENV, "").strip()
    if override:
        try:
            rows = int(override)
        except ValueError:
            rows = 0
        if rows < 1:
            raise ValueError(f"{_CHUNK_ROWS_ENV} must be a positive integer, got {override!r}")
    else:
        rows = max(1, _CHUNK_BYTES // max(1, vocab * itemsize))
    rows = 1 << (rows.bit_length() - 1)
    return max(1, min(rows, n_rows))


def working_set_bytes(n_rows: int, hidden: int, vocab: int, itemsize: int, chunk_rows: int,
                      has_bias: bool = False) -> int:
    """Peak bytes one forward+backward ('mean' or 'sum') allocates above its inputs.

    grad_weight (V x H) and grad_hidden (N x H) in the inputs' dtype, the outputs the caller
    gets; one chunk of logits (C x V, the inputs' dtype, turned into its gradient in place);
    the fp32 loss per row and, with a bias, its fp32 gradient. On the H200 the measured peaks
    (benchmarks/results/kernels-h200-linear-ce.json) were this plus at most the allocator's
    rounding of a block (0.04 to 0.75 MiB): grad_weight and grad_hidden are most of it, and only
    the chunk is ours to choose.
    """
    chunk = min(chunk_rows, n_rows)
    return ((vocab * hidden + n_rows * hidden + chunk * vocab) * itemsize + n_rows * 4
            + (vocab * 4 if has_bias else 0))


def chunk_rows_for_budget(n_rows: int, hidden: int, vocab: int, itemsize: int, budget_bytes: int,
                          has_bias: bool = False) -> int:
    """The most rows per chunk (a multiple of 16, GEMM-friendly) whose working set fits budget_bytes.

    Raises ValueError when not even 16 rows fit (the gradients alone may exceed the budget).
    """
    fixed = working_set_bytes(n_rows, hidden, vocab, itemsize, 0, has_bias)
    rows = (budget_bytes - fixed) // (vocab * itemsize) // 16 * 16
    if rows < 16:
        need = working_set_bytes(n_rows, hidden, vocab, itemsize, 16, has_bias)
        raise ValueError(
            f"fused_linear_cross_entropy: a working set of {budget_bytes / 2**30:.3f} GiB is too small for "
            f"{n_rows} rows of {hidden} -> {vocab}; 16 rows per chunk need {need / 2**30:.3f} GiB"
        )
    return int(min(rows, max(n_rows, 1)))


def _chunked(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
    ignore_index: int, scale: torch.Tensor, want_grad: bool, chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss per row and, when want_grad, the gradients for d(sum_i scale_i * loss_i)."""
    n_rows = int(hidden.shape[0])  # the chunk loop is Python: a compiled graph specializes on N
    vocab = weight.shape[0]
    dev = hidden.device
    loss = torch.empty(n_rows, dtype=torch.float32, device=dev)
    grad_h = torch.empty_like(hidden) if want_grad else hidden.new_empty(0)
    # The first chunk writes grad_w whole (mm, then addmm_ for the rest); with no rows, zeros.
    if want_grad:
        grad_w = torch.empty_like(weight) if n_rows > 0 else torch.zeros_like(weight)
    else:
        grad_w = weight.new_empty(0)
    if want_grad and bias is not None:
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=dev)
    else:
        grad_b = hidden.new_empty(0, dtype=torch.float32)
    scale_stride = 1 if scale.dim() == 1 else 0
    block = min(_BLOCK, triton.next_power_of_2(int(vocab)))
    warps = _common.warps_for(block)
    w_t = weight.t()
    for start in range(0, n_rows, chunk_rows):
        end = min(start + chunk_rows, n_rows)
        h = hidden[start:end]
        logits = torch.addmm(bias, h, w_t) if bias is not None else torch.mm(h, w_t)
        if not _common.tracing_interpreted(logits):
            _launch.of(_fused_linear_cross_entropy_fwd_kernel)[(end - start,)](
                logits, target, loss, scale, scale_stride, start, vocab, ignore_index,
                WRITE_GRAD=want_grad, BLOCK=block, num_warps=warps,
            )
        if want_grad:
            torch.mm(logits, weight, out=grad_h[start:end])
            if start == 0:
                torch.mm(logits.t(), h, out=grad_w)
            else:
                grad_w.addmm_(logits.t(), h)
            if bias is not None:
                grad_b += logits.sum(0, dtype=torch.float32)
        del logits  # free this chunk before the next one is allocated
    return loss, grad_h, grad_w, grad_b


def _row_scale(target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return 1.0 / (target != ignore_index).sum().to(torch.float32)
    return torch.ones((), dtype=torch.float32, device=target.device)


def _flce_impl(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, reduction: str, compute_grad: bool, chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = hidden.contiguous()
    target = target.contiguous()
    scale = _row_scale(target, ignore_index, reduction)
    want_grad = compute_grad and reduction != "none"
    loss, grad_h, grad_w, grad_b = _chunked(
        hidden, weight, bias, target, ignore_index, scale, want_grad, chunk_rows
    )
    if reduction == "mean":
        loss = loss.sum() * scale
    elif reduction == "sum":
        loss = loss.sum()
    return loss, grad_h, grad_w, grad_b


def _flce_backward_impl(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    grad_rows: torch.Tensor, ignore_index: int, chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # reduction='none': recompute each chunk with the per-row incoming gradient as its scale.
    grad_rows = grad_rows.to(torch.float32).contiguous()  # may arrive expanded (stride 0)
    _, grad_h, grad_w, grad_b = _chunked(
        hidden.contiguous(), weight, bias, target.contiguous(), ignore_index, grad_rows, True, chunk_rows
    )
    return grad_h, grad_w, grad_b


_flce_op = triton_op("gputune::fused_linear_cross_entropy", mutates_args={})(_flce_impl)
_flce_backward_op = triton_op("gputune::fused_linear_cross_entropy_backward", mutates_args={})(
    _flce_backward_impl
)


def _setup_context(ctx, inputs, output):
    # The gradient outputs get no gradient: zeros built for them would double the memory.
    ctx.set_materialize_grads(False)
    hidden, weight, target, bias, ignore_index, reduction, _, chunk_rows = inputs
    ctx.reduction = reduction
    ctx.ignore_index = ignore_index
    ctx.chunk_rows = chunk_rows
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, target, bias)
    else:
        ctx.save_for_backward(*output[1:])


def _backward(ctx, grad_loss, _gh, _gw, _gb):
    if ctx.reduction == "none":
        hidden, weight, target, bias = ctx.saved_tensors
        grad_h, grad_w, grad_b = _common.call_backward(
            _flce_backward_op, _flce_backward_impl,
            hidden, weight, target, bias, grad_loss, ctx.ignore_index, ctx.chunk_rows,
        )
    else:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        # Scaled in place: a second grad_weight-sized buffer would double the peak memory.
        g = grad_loss.to(torch.float32)
        grad_h.mul_(g)
        grad_w.mul_(g)
        grad_b.mul_(g)
    grad_b = grad_b.to(ctx.bias_dtype) if ctx.has_bias else None
    return grad_h, grad_w, None, grad_b, None, None, None, None


_flce_op.register_autograd(_backward, setup_context=_setup_context)
_FusedLinearCrossEntropyFunction = _common.eager_function(
    "_FusedLinearCrossEntropyFunction", _flce_impl, _setup_context, _backward
)


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
    reduction: str = "mean", bias: Optional[torch.Tensor] = None, *, chunk_rows: Optional[int] = None,
) -> torch.Tensor:
    """cross_entropy(hidden @ weight.T + bias, target) without building the (N, V) logits.

    hidden is (N, H) (or (..., H), flattened to rows), weight is (V, H) as in nn.Linear,
    target holds N class indices. Under torch.autocast, hidden, weight and bias are cast to
    the autocast dtype first, as autocast would do for the linear layer. The loss is fp32.
    """
    op = "fused_linear_cross_entropy"
    _common.check_float(op, "hidden", hidden)
    _common.check_float(op, "weight", weight)
    _common.check_same_device(op, "hidden", hidden, "weight", weight)
    _common.check_reduction(op, reduction)
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{op}: hidden must be (N, H) and weight (V, H) with the same H, got hidden "
            f"{tuple(hidden.shape)} and weight {tuple(weight.shape)}"
        )
    if bias is not None:
        _common.check_float(op, "bias", bias)
        _common.check_same_device(op, "hidden", hidden, "bias", bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"{op}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    _common.check_target(op, target, hidden2.shape[0], hidden)
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        hidden2, weight = hidden2.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    if hidden2.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise TypeError(
            f"{op}: hidden, weight and bias must share one dtype (or run under torch.autocast), got "
            f"{hidden2.dtype}, {weight.dtype}" + (f", {bias.dtype}" if bias is not None else "")
        )
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden2.shape[0], weight.shape[0], weight.element_size())
    elif chunk_rows < 1:
        raise ValueError(f"{op}: chunk_rows must be a positive int, got {chunk_rows}")
    compute_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    loss = _common.call(
        _flce_op, _FusedLinearCrossEntropyFunction, _flce_impl,
        hidden2, weight, target.reshape(-1), bias, int(ignore_index), reduction, bool(compute_grad), int(chunk_rows),
    )[0]
    return loss.view(target.shape) if reduction == "none" else loss

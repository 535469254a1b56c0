"""The second stage of the norms' weight gradients: add the persistent grid's partial sums.

The norm backward kernels leave one fp32 row of partial sums per program (P x n_cols, one
block of them per gradient). `add` adds the P rows column by column and writes the sums in the
gradients' dtype, in one of two ways (`MODE`, or GPUTUNE_PARTIAL_SUMS in the environment):

- "kernel": this module's Triton kernel, one launch for dweight and dbias together, where a
  torch ``part.sum(0).to(dtype)`` per gradient costs two launches and an allocation each;
- "torch": per gradient, torch's column sum and a copy into the gradient's dtype (no copy when
  that is fp32): torch ops in place of a Triton launch, the cheaper on a host where a Triton
  launch costs more than those (benchmarks/kernels_bench.py measures both side by side).

Either way the order of the additions is fixed, so the gradients are deterministic.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gputune_kernels import _common, _launch

#: Columns per program (128 programs at 4096 columns) and partial rows per step.
BLOCK_COLS = 32
BLOCK_PARTS = 64

MODES = ("kernel", "torch")
MODE = os.environ.get("GPUTUNE_PARTIAL_SUMS", "kernel")
if MODE not in MODES:
    raise ValueError(f"GPUTUNE_PARTIAL_SUMS must be one of {', '.join(MODES)}, got {MODE!r}")


@triton.jit
def _sum_partials_kernel(
    part_ptr, out_ptr, out2_ptr, n_parts, n_cols,
    TWO: tl.constexpr, BLOCK_PARTS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    # part_ptr holds (1 or 2, n_parts, n_cols) fp32; out (and out2 when TWO) get the column sums.
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = cols < n_cols
    acc = tl.zeros([BLOCK_PARTS, BLOCK_COLS], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_PARTS, BLOCK_COLS], dtype=tl.float32)
    second = tl.cast(n_parts, tl.int64) * n_cols
    for start in range(0, n_parts, BLOCK_PARTS):
        parts = start + tl.arange(0, BLOCK_PARTS)
        off = parts[:, None].to(tl.int64) * n_cols + cols[None, :]
        mask = (parts[:, None] < n_parts) & col_ok[None, :]
        acc += tl.load(part_ptr + off, mask=mask, other=0.0)
        if TWO:
            acc2 += tl.load(part_ptr + second + off, mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_ok)
    if TWO:
        tl.store(out2_ptr + cols, tl.sum(acc2, axis=0).to(out2_ptr.dtype.element_ty), mask=col_ok)


def add(part: torch.Tensor, out: torch.Tensor, out2: torch.Tensor | None = None) -> None:
    """out = the column sums of part's partial rows, part (P, n) fp32; with out2, part is
    (2, P, n) and out2 gets the second block's. The outputs are in the gradients' dtype."""
    if MODE == "torch":
        if out2 is None:
            _column_sums(part, out)
        else:
            _column_sums(part[0], out)
            _column_sums(part[1], out2)
        return
    n_cols = out.shape[0]
    _launch.of(_sum_partials_kernel)[(_common.cdiv(n_cols, BLOCK_COLS),)](
        part, out, out if out2 is None else out2, part.shape[-2], n_cols, TWO=out2 is not None,
        BLOCK_PARTS=BLOCK_PARTS, BLOCK_COLS=BLOCK_COLS,
    )


def compiled(dtype: torch.dtype, n_parts: int, n_cols: int, two: bool):
    """The kernel compiled for gradients of `dtype`, for a C++ node (_native.compiled); None
    when the sums are set to be torch's (MODE), which the nodes do not do."""
    from gputune_kernels import _native

    if MODE != "kernel":
        return None
    return _native.compiled(
        _sum_partials_kernel, "pppii", torch.float32, dtype, dtype, n_parts, n_cols, TWO=two,
        BLOCK_PARTS=BLOCK_PARTS, BLOCK_COLS=BLOCK_COLS,
    )


def _column_sums(part: torch.Tensor, out: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        torch.sum(part, 0, out=out)
    else:
        out.copy_(part.sum(0))

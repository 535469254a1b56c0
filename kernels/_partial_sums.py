"""The second stage of the norms' weight gradients: add the persistent grid's partial sums.

The norm backward kernels leave one fp32 row of partial sums per program (P x n_cols, one
block of them per gradient). This kernel adds the P rows column by column and writes the
result in the weight's dtype: one launch for dweight (and dbias), where a torch
``part.sum(0).to(dtype)`` per gradient costs two launches and two allocations each.
The order of the additions is fixed, so the gradients are deterministic.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gputune_kernels import _common

#: Columns per program (128 programs at 4096 columns) and partial rows per step.
BLOCK_COLS = 32
BLOCK_PARTS = 64


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


def grid(n_cols: int) -> tuple[int]:
    return (_common.cdiv(n_cols, BLOCK_COLS),)

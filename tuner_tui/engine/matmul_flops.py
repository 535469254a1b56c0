"""FLOPs of the matrix-multiply operators, counted from their input shapes (as the profiler
records them with `record_shapes=True`), so that a profile's achieved TFLOP/s does not depend on
the profiler's own FLOP counts. Torch-free: plain shapes in, a number out.

What is counted (2 FLOPs per multiply-add; bias adds, scales and softmax are left out):
- GEMMs: mm, addmm, _addmm_activation, bmm, baddbmm, _scaled_mm (fp8), mv, addmv, dot.
  linear and matmul are not counted themselves: they decompose into these, which are.
- Attention: the fused SDPA implementations (flash, memory-efficient, cuDNN, the CPU's flash,
  and their backwards). Forward: the score matmul Q·Kᵀ and the value matmul P·V, 2·Lq·Lk·(E + Ev)
  per head; backward: twice that (dV, dP, dQ, dK; the recomputation of the scores inside flash
  backward is not useful work and not counted). A causal call counts only the unmasked scores
  (about half), as those kernels skip the masked blocks. A call with an explicit mask counts all.
  SDPA's math fallback is not counted itself: its bmm's are, as GEMMs.
"""

from __future__ import annotations

MATMUL = "matmul"
ATTENTION = "attention"

_GEMMS = {
    # name: (index of the left matrix, index of the right matrix) among the inputs
    "aten::mm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::_addmm_activation": (1, 2),
    "aten::_scaled_mm": (0, 1),
    "aten::bmm": (0, 1),
    "aten::baddbmm": (1, 2),
    "aten::mv": (0, 1),
    "aten::addmv": (1, 2),
    "aten::dot": (0, 1),
}

_SDPA = {
    # name: (index of the query among the inputs, index of is_causal, backward?)
    "aten::_scaled_dot_product_flash_attention": (0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 6, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 4, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": (0, 5, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 14, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 7, True),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (1, 13, True),
}


def family(name: str) -> str | None:
    """MATMUL or ATTENTION for an operator whose FLOPs are counted here, else None."""
    if name in _GEMMS:
        return MATMUL
    if name in _SDPA:
        return ATTENTION
    return None


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def gemm_flops(left: list[int], right: list[int]) -> float:
    """2·(batch)·M·K·N for [..., M, K] @ [..., K, N]; a vector side counts as one row or column."""
    if not left or not right:
        return 0.0
    k = left[-1]
    m = _product(left[:-1])  # a leading batch dimension (bmm) multiplies the rows
    n = right[-1] if len(right) >= 2 else 1
    return 2.0 * m * k * n


def attention_flops(query: list[int], key: list[int], value: list[int], causal: bool,
                    backward: bool) -> float:
    """Q [B, H, Lq, E], K [B, Hk, Lk, E], V [B, Hk, Lk, Ev] (grouped-query: Hk divides H)."""
    if len(query) != 4 or len(key) != 4 or len(value) != 4:
        return 0.0
    b, h, lq, e = query
    lk, ev = key[2], value[3]
    if causal:  # row i sees keys 0..i (top-left aligned, as SDPA's is_causal)
        scores = lq * (lq + 1) // 2 if lq <= lk else lk * (lk + 1) // 2 + (lq - lk) * lk
    else:
        scores = lq * lk
    forward = 2.0 * b * h * scores * (e + ev)
    return 2 * forward if backward else forward


def op_flops(name: str, shapes: list, scalars: list | None = None) -> float:
    """The FLOPs of one call of `name` with input `shapes` (one list of sizes per input, [] for
    a non-tensor) and `scalars` (the non-tensor inputs' values by position, where recorded:
    SDPA's is_causal); 0 for an operator not counted here or shapes not recorded."""
    shapes = shapes or []
    if name in _GEMMS:
        i, j = _GEMMS[name]
        if len(shapes) <= j:
            return 0.0
        return gemm_flops(list(shapes[i]), list(shapes[j]))
    if name in _SDPA:
        q, causal_at, backward = _SDPA[name]
        if len(shapes) < q + 3:
            return 0.0
        causal = bool(scalars and len(scalars) > causal_at and scalars[causal_at] is True)
        return attention_flops(list(shapes[q]), list(shapes[q + 1]), list(shapes[q + 2]),
                               causal, backward)
    return 0.0

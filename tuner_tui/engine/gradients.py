"""The gradient gate: a configuration's first-step gradients against the fp32 eager reference's.

Losses alone miss gradient bugs: AdamW normalises a uniform scale away and clipping hides
another, so a x2 in a kernel's backward leaves the first losses unchanged. The first step's
gradients are compared per parameter tensor instead (cosine similarity and norm ratio).

Gradients never cross the protocol (tensors, up to billions of values): the worker computes the
reference gradients itself, in the trial's own process, before the candidate is built (fp32,
eager, SDPA, the same seed and first batch), keeps them on the CPU, and compares them after the
candidate's first backward pass, before its optimizer step. The cost is one extra fp32
forward/backward per trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


# (least cosine similarity, largest |norm ratio - 1|) per precision, for every parameter tensor
# whose reference gradient is not negligible. Measured with benchmarks/gradient_calibration.py
# on the CPU over gpt2-tiny, llama-tiny and the Hugging Face tiny GPT-2 and Llama examples, each
# fp32 and bf16, with manual or SDPA attention, full checkpointing, and all fused kernels. The
# worst tensor seen (usually a norm's weight):
#   fp32: cosine 1 - 5e-14, norm ratio 1 +- 1.3e-7  (summation order only)
#   bf16: cosine 0.999985,  norm ratio 1 +- 0.006   (autocast matmuls)
# On a GPU more runs in bf16 (flash attention, Inductor's fused kernels), so the bf16 tolerance
# leaves room of about 1000x on the cosine deficit and 25x on the norm; the lead's GPU check
# (gpu_checks.sh gradient-calibration) prints the H200's figures. Every injected fault lands far
# outside any of them: x2 gives a norm ratio of 2, zeroed gradients a cosine of 0, a wrong sign
# a cosine of -1. tf32 keeps 10 mantissa bits, between the two. fp8 (torchao float8 in the
# linear layers) keeps 3 or 2: on the H200, clean fp8 tensorwise runs of the 1.3B HF Llama had
# their worst tensor (a k_proj weight) at cosine 0.940 and norm ratio 0.965
# (benchmarks/results/h200-2026-11-30/call6-fit-probe); the injected faults still land far out.
GRADIENT_TOLERANCE = {
    "fp32": (0.9999, 1e-3),
    "tf32": (0.999, 0.02),
    "bf16": (0.98, 0.15),
    "fp16": (0.995, 0.05),
    "fp8": (0.85, 0.25),
}

NEGLIGIBLE = 1e-4
"""A tensor whose reference gradient norm is below this fraction of the largest tensor's, and
whose candidate norm is too, is left out: its direction is rounding noise at low precision."""

WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
"""Name components that wrappers (torch.compile, checkpoint_wrapper, FSDP) put into parameter
names; DDP's `module.` is stripped as a prefix only."""


def canonical_name(name: str) -> str:
    parts = [p for p in name.split(".") if p not in WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def _whole(g: torch.Tensor) -> torch.Tensor:
    """A sharded gradient (FSDP2's DTensor) gathered whole; a plain one as it is."""
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def collect(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as fp32 on the CPU, keyed by its canonical name (a parameter
    without a gradient counts as zero)."""
    grads = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        grads[canonical_name(name)] = (
            torch.zeros(p.shape, dtype=torch.float32) if g is None
            else _whole(g.detach()).to("cpu", torch.float32, copy=True)
        )
    return grads


@dataclass(frozen=True)
class GradientCheck:
    ok: bool | None
    """None: nothing to compare (no tensor matched by name)."""
    compared: int
    worst_tensor: str = ""
    min_cosine: float | None = None
    worst_norm_ratio: float | None = None
    message: str = ""


def compare(reference: dict[str, torch.Tensor], model: nn.Module, precision: str) -> GradientCheck:
    """The candidate's gradients (on `model` now) against the reference's, per tensor."""
    min_cos, max_dev = GRADIENT_TOLERANCE.get(precision, GRADIENT_TOLERANCE["bf16"])
    candidate = {}
    for name, p in model.named_parameters():
        key = canonical_name(name)
        if key in reference and p.requires_grad and tuple(p.shape) == tuple(reference[key].shape):
            candidate[key] = p.grad
    if not candidate:
        return GradientCheck(None, 0, message="no parameter matched the reference by name")
    largest = max(float(g.norm()) for g in reference.values()) or 1.0
    worst = None  # (badness, name, cosine, ratio)
    for name, g in candidate.items():
        ref = reference[name].to(torch.float64)
        cand = (torch.zeros_like(ref) if g is None
                else _whole(g.detach()).to("cpu", torch.float64))
        ref_norm, cand_norm = float(ref.norm()), float(cand.norm())
        if not math.isfinite(cand_norm):
            worst = (math.inf, name, math.nan, math.nan)
            break
        if ref_norm < NEGLIGIBLE * largest and cand_norm < NEGLIGIBLE * largest:
            continue
        cosine = float((ref * cand).sum()) / (ref_norm * cand_norm) if ref_norm and cand_norm else 0.0
        ratio = cand_norm / ref_norm if ref_norm else math.inf
        # How far past its tolerance each figure is; the worst tensor is the one furthest out.
        badness = max((1 - cosine) / (1 - min_cos), abs(ratio - 1) / max_dev)
        if worst is None or badness > worst[0]:
            worst = (badness, name, cosine, ratio)
    if worst is None:
        return GradientCheck(True, len(candidate))
    badness, name, cosine, ratio = worst
    ok = badness <= 1.0
    message = "" if ok else (
        f"first-step gradients differ from the fp32 reference: {name} "
        + ("is not finite" if not math.isfinite(badness) else
           f"cosine {cosine:.4f}, norm ratio {ratio:.3g}")
        + f" (tolerance cosine >= {min_cos}, ratio 1 +- {max_dev:g} for {precision})"
    )
    return GradientCheck(ok, len(candidate), name, cosine, ratio, message)

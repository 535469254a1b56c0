"""The gradient gate: a configuration's first-step gradients against the fp32 eager reference's.

Losses alone miss gradient bugs: AdamW normalises a uniform scale away and clipping hides
another, so a x2 in a kernel's backward leaves the first losses unchanged. The first step's
gradients are compared per parameter tensor instead (cosine similarity and norm ratio).

Gradients never cross the protocol (tensors, up to billions of values). The reference is kept as
a sketch (`sketch`): each tensor's exact norm and its values at a fixed sample of positions (all
of them for tensors of up to SKETCH_SIZE elements), enough for the cosine and the norm ratio at
these tolerances (a fault that changes a small part of a large tensor moves its cosine by that
part, under any tolerance here), at about 64 KiB a tensor. A worker computes the reference's
gradients at most once per workload, batch and machine (fp32, eager, SDPA, the same seed and
first batch) and keeps the sketch in the reference cache (`reference_cache.py`), where the next
trial's worker finds it; the candidate is compared after its first backward pass, before its
optimizer step.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from strategies.registry import NUMERICS


GRADIENT_TOLERANCE = {name: grads for name, (_, grads) in NUMERICS.items()}
"""(least cosine similarity, largest |norm ratio - 1|) per numerics class, for every parameter
tensor whose reference gradient is not negligible (`strategies.registry.NUMERICS` says where
the figures come from)."""

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


SKETCH_SIZE = 16384
"""Positions sampled per tensor for the cosine; a tensor this size or smaller is kept whole."""


@dataclass(frozen=True)
class TensorSketch:
    numel: int
    norm: float
    """The whole tensor's norm: the norm ratio is exact."""
    values: torch.Tensor
    """fp32 on the CPU: the values at `sample_indices(name, numel)`, or every value."""
    wobble: float = 0.0
    """1 - the cosine between this gradient and the same computed once more in fp32 with every
    parameter perturbed by rounding-sized noise (`WOBBLE_NOISE`): how far its direction moves
    for nothing but rounding. Near 0 for most tensors; near 1 or more where the gradient is a sum
    that cancels (a deep CNN's BatchNorm weights: in bf16 their first-step cosine can be
    anything, seen on the H200 with ResNet-50)."""
    wobble_ratio: float = 0.0
    """|norm ratio - 1| under the same perturbation."""


def sample_indices(name: str, numel: int) -> torch.Tensor | None:
    """The positions sketched for a tensor: the same for the reference and every candidate (drawn
    from the tensor's name), None for a tensor kept whole."""
    if numel <= SKETCH_SIZE:
        return None
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(numel, (SKETCH_SIZE,), generator=generator).sort().values


def _sampled(name: str, g: torch.Tensor) -> tuple[float, torch.Tensor]:
    """A gradient's norm and its sampled values in fp64 on the CPU (gathered first where sharded)."""
    flat = _whole(g.detach()).reshape(-1)
    index = sample_indices(name, flat.numel())
    picked = flat if index is None else flat[index.to(flat.device)]
    return float(flat.double().norm()), picked.to("cpu", torch.float64)


def sketch(grads: dict[str, torch.Tensor]) -> dict[str, TensorSketch]:
    """The sketch of a set of gradients (name -> tensor, as `collect` gives them)."""
    out = {}
    for name, g in grads.items():
        norm, values = _sampled(name, g)
        out[name] = TensorSketch(g.numel(), norm, values.float())
    return out


def sketch_model(model: nn.Module) -> dict[str, TensorSketch]:
    """The sketch of a model's gradients where they are (no copy of the whole to the CPU)."""
    out = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = canonical_name(name)
        if p.grad is None:
            out[key] = TensorSketch(p.numel(), 0.0, torch.zeros(min(p.numel(), SKETCH_SIZE)))
        else:
            norm, values = _sampled(key, p.grad)
            out[key] = TensorSketch(p.numel(), norm, values.float())
    return out


WOBBLE_NOISE = 2.0 ** -8
"""The relative noise put on every parameter to see how much rounding moves each gradient: about
bf16's rounding of a value."""
WOBBLE_ALLOWANCE = 4.0
"""A candidate may move a tensor's gradient this many times as far as that noise moved it ..."""
UNSTEADY = 0.05
"""... and where that noise turned a tensor's direction by more than this (1 - cosine), the
tensor is not compared (but for being finite): at the first step its gradient is not
reproducible even in fp32 (a deep CNN at initialisation, seen on a ResNet-50: its BatchNorm and
convolution weights alike, their norms by up to 1.7x in bf16). A fault there cannot be told
from rounding; the loss check still holds such a model."""


def with_wobble(clean: dict[str, TensorSketch],
                perturbed: dict[str, TensorSketch]) -> dict[str, TensorSketch]:
    """`clean`, each tensor with how far the perturbed run moved it (`TensorSketch.wobble`)."""
    out = {}
    for name, s in clean.items():
        other = perturbed.get(name)
        if other is None or not s.norm or not other.norm:
            out[name] = s
            continue
        a, b = s.values.double(), other.values.double()
        na, nb = float(a.norm()), float(b.norm())
        cosine = float((a * b).sum()) / (na * nb) if na and nb else 1.0
        out[name] = TensorSketch(s.numel, s.norm, s.values, max(0.0, 1 - cosine),
                                 abs(other.norm / s.norm - 1))
    return out


def save_sketch(path: str | Path, sketched: dict[str, TensorSketch]) -> None:
    """Write a sketch atomically (a reader never sees half a file)."""
    import io

    from strategies.files import write_atomic

    buffer = io.BytesIO()
    torch.save({name: (s.numel, s.norm, s.values, s.wobble, s.wobble_ratio)
                for name, s in sketched.items()}, buffer)
    write_atomic(path, buffer.getvalue())


def load_sketch(path: str | Path) -> dict[str, TensorSketch] | None:
    """A sketch written by `save_sketch`; None where there is none or it cannot be read."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        return {name: TensorSketch(int(n), float(norm), values, float(w), float(wr))
                for name, (n, norm, values, w, wr) in data.items()}
    except Exception:  # a missing, truncated or foreign file: the reference is computed again
        return None


@dataclass(frozen=True)
class GradientCheck:
    ok: bool | None
    """None: nothing to compare (no tensor matched by name)."""
    compared: int
    worst_tensor: str = ""
    min_cosine: float | None = None
    worst_norm_ratio: float | None = None
    message: str = ""


def compare(reference: dict, model: nn.Module, precision: str) -> GradientCheck:
    """The candidate's gradients (on `model` now) against the reference's, per tensor.
    `reference` is a sketch (`sketch`) or whole gradients (`collect`), which are sketched."""
    min_cos, max_dev = GRADIENT_TOLERANCE.get(precision, GRADIENT_TOLERANCE["bf16"])
    if reference and not isinstance(next(iter(reference.values())), TensorSketch):
        reference = sketch(reference)
    candidate = {}
    for name, p in model.named_parameters():
        key = canonical_name(name)
        if key in reference and p.requires_grad and p.numel() == reference[key].numel:
            candidate[key] = p
    if not candidate:
        return GradientCheck(None, 0, message="no parameter matched the reference by name")
    largest = max(s.norm for s in reference.values()) or 1.0
    worst = None  # (badness, name, cosine, ratio)
    compared = unsteady = 0
    for name, p in candidate.items():
        ref = reference[name]
        ref_values = ref.values.to(torch.float64)
        if p.grad is None:
            cand_norm, cand_values = 0.0, torch.zeros_like(ref_values)
        else:
            cand_norm, cand_values = _sampled(name, p.grad)
        ref_norm = ref.norm
        if not math.isfinite(cand_norm):
            worst = (math.inf, name, math.nan, math.nan)
            break
        if ref_norm < NEGLIGIBLE * largest and cand_norm < NEGLIGIBLE * largest:
            continue
        ref_sample, cand_sample = float(ref_values.norm()), float(cand_values.norm())
        cosine = (float((ref_values * cand_values).sum()) / (ref_sample * cand_sample)
                  if ref_sample and cand_sample else 0.0)
        ratio = cand_norm / ref_norm if ref_norm else math.inf
        # How far past its tolerance each figure is; the worst tensor is the one furthest out.
        # A tensor that rounding alone moves (`TensorSketch.wobble`) is allowed as much again.
        if ref.wobble > UNSTEADY:
            unsteady += 1
            continue
        compared += 1
        cos_allowed = max(1 - min_cos, WOBBLE_ALLOWANCE * ref.wobble)
        ratio_allowed = max(max_dev, WOBBLE_ALLOWANCE * ref.wobble_ratio)
        badness = max((1 - cosine) / cos_allowed, abs(ratio - 1) / ratio_allowed)
        if worst is None or badness > worst[0]:
            worst = (badness, name, cosine, ratio)
    if worst is None:
        if unsteady and not compared:
            return GradientCheck(None, 0, message=(
                "unchecked: this model's first-step gradients are not reproducible even in fp32 "
                "under rounding-sized noise (a deep network at initialisation); its loss is checked"))
        return GradientCheck(True, compared)
    badness, name, cosine, ratio = worst
    ok = badness <= 1.0
    message = "" if ok else (
        f"first-step gradients differ from the fp32 reference: {name} "
        + ("is not finite" if not math.isfinite(badness) else
           f"cosine {cosine:.4f}, norm ratio {ratio:.3g}")
        + f" (tolerance cosine >= {min_cos}, ratio 1 +- {max_dev:g} for {precision})"
    )
    return GradientCheck(ok, compared, name, cosine, ratio, message)

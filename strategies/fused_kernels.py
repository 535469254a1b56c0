"""Fused Triton kernels: swap modules for ones that call gputune's kernels.

Recognised on any model: `nn.LayerNorm`, `nn.RMSNorm` and RMSNorm-like modules (a `weight`
and an `eps` or `variance_epsilon`, class name ending in RMSNorm, such as Hugging Face's
LlamaRMSNorm), `nn.GELU(approximate="tanh")` and Hugging Face's tanh-GELU modules
(NewGELUActivation, PytorchGELUTanh, GELUTanh), gated MLPs with `gate_proj`, `up_proj`,
`down_proj` and a SiLU `act_fn` (Llama, Mistral, Qwen and others in Hugging Face's library),
and any module carrying a `gputune_kernel` attribute that names a kernel (gputune's built-in
models mark their causal softmax, SwiGLU product and LM-head loss this way). Parameters are
shared with the replaced module, so an optimizer built before or after the swap sees the same
tensors.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from strategies import hf_causal_lm_loss
from strategies.config import ConfigError
from strategies.registry import FUSED_KERNEL_CHOICES


class FusedLayerNorm(nn.Module):
    def __init__(self, source: nn.LayerNorm) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = source.weight, source.bias, source.eps

    def forward(self, x):
        import gputune_kernels

        return gputune_kernels.layer_norm(x, self.weight, self.bias, self.eps)


def _rms_eps(source: nn.Module) -> float:
    eps = getattr(source, "eps", None)
    if eps is None:
        eps = getattr(source, "variance_epsilon", None)
    return eps if eps is not None else torch.finfo(torch.float32).eps


class FusedRMSNorm(nn.Module):
    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.weight = source.weight
        self.eps = _rms_eps(source)

    def forward(self, x):
        import gputune_kernels

        return gputune_kernels.rms_norm(x, self.weight, self.eps)


class FusedGeluTanh(nn.Module):
    def forward(self, x):
        import gputune_kernels

        return gputune_kernels.gelu_tanh(x)


class FusedSiluMul(nn.Module):
    def forward(self, gate, up):
        import gputune_kernels

        return gputune_kernels.swiglu(gate, up)


class FusedGatedMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)) with the product as one kernel; the three
    projections are the replaced MLP's own modules."""

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = source.gate_proj, source.up_proj, source.down_proj

    def forward(self, x):
        import gputune_kernels

        return self.down_proj(gputune_kernels.swiglu(self.gate_proj(x), self.up_proj(x)))


class FusedCausalSoftmax(nn.Module):
    def forward(self, scores, scale):
        import gputune_kernels

        return gputune_kernels.causal_softmax(scores, scale)


class FusedLinearCrossEntropy(nn.Module):
    """hidden @ weight.T then cross-entropy, chunked: the full logits never exist."""

    def forward(self, hidden, weight, targets):
        import gputune_kernels

        return gputune_kernels.fused_linear_cross_entropy(hidden, weight, targets)


class LinearThenFusedCrossEntropy(nn.Module):
    """The logits are built by a matmul; only the cross-entropy is the fused kernel."""

    def forward(self, hidden, weight, targets):
        import gputune_kernels

        return gputune_kernels.cross_entropy(hidden @ weight.t(), targets)


def _is_rms_norm(m: nn.Module) -> bool:
    if isinstance(m, nn.RMSNorm):
        return m.weight is not None
    return (
        type(m).__name__.endswith("RMSNorm")
        and isinstance(getattr(m, "weight", None), nn.Parameter)
        and (hasattr(m, "eps") or hasattr(m, "variance_epsilon"))
        and _computes_rms_norm(m)
    )


def _computes_rms_norm(m: nn.Module) -> bool:
    """Whether a module named like an RMSNorm computes x / rms(x) * weight, as the kernel does:
    not every one does (Gemma's scales by 1 + weight, its weight starting at zero: swapped, its
    blocks would output zeros). Probed on a copy on the CPU in fp32 with weights of its own, so
    that a model on the meta device (the workload's facts are read there), on a GPU or in bf16
    is told alike, and neither its weights nor its random state are touched."""
    if m.weight.dim() != 1:
        return False
    try:
        probe = copy.deepcopy(m).to_empty(device="cpu").float()
        width = probe.weight.shape[0]
        x = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            probe.weight.copy_(torch.linspace(0.5, 1.5, width))
            own = probe(x).float()
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _rms_eps(m)) * probe.weight
    except Exception:  # (a forward that takes more than a tensor: not a plain RMSNorm)
        return False
    return own.shape == want.shape and torch.allclose(own, want, rtol=1e-4, atol=1e-5)


# Hugging Face's modules that compute GELU with the tanh approximation.
_TANH_GELU_NAMES = frozenset({"NewGELUActivation", "PytorchGELUTanh", "GELUTanh"})


def _is_tanh_gelu(m: nn.Module) -> bool:
    if isinstance(m, nn.GELU):
        return m.approximate == "tanh"
    return type(m).__name__ in _TANH_GELU_NAMES


def _is_silu(m: nn.Module) -> bool:
    return isinstance(m, nn.SiLU) or type(m).__name__ in ("SiLUActivation", "SiLU")


def _is_gated_silu_mlp(m: nn.Module) -> bool:
    """An MLP computing down_proj(act_fn(gate_proj(x)) * up_proj(x)) with SiLU, by its parts'
    names, as Hugging Face's Llama-family MLPs are written (their forward is not inspected: a
    module with these parts and another forward would be misread, hence the exact names)."""
    parts = [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (
        all(isinstance(p, nn.Linear) for p in parts)
        and _is_silu(getattr(m, "act_fn", None) or nn.Identity())
        and type(m).__name__.endswith("MLP")
    )


def replacement_for(module: nn.Module, chosen: set[str]) -> tuple[str, nn.Module] | None:
    """The (kernel name, new module) for `module`, or None to leave it."""
    marker = getattr(type(module), "gputune_kernel", None)
    if marker == "causal_softmax" and "causal_softmax" in chosen:
        return "causal_softmax", FusedCausalSoftmax()
    if marker == "swiglu" and "swiglu" in chosen:
        return "swiglu", FusedSiluMul()
    if marker == "linear_cross_entropy":
        if "linear_cross_entropy" in chosen:
            return "linear_cross_entropy", FusedLinearCrossEntropy()
        if "cross_entropy" in chosen:
            return "cross_entropy", LinearThenFusedCrossEntropy()
    if "layer_norm" in chosen and _is_plain_layer_norm(module):
        return "layer_norm", FusedLayerNorm(module)
    if "rms_norm" in chosen and _is_rms_norm(module):
        return "rms_norm", FusedRMSNorm(module)
    if "gelu" in chosen and _is_tanh_gelu(module):
        return "gelu", FusedGeluTanh()
    if "swiglu" in chosen and _is_gated_silu_mlp(module):
        return "swiglu", FusedGatedMLP(module)
    return None


def _is_plain_layer_norm(module: nn.Module) -> bool:
    """An nn.LayerNorm with weights whose forward is nn.LayerNorm's: a subclass with a forward
    of its own computes something else around the norm (torchvision's LayerNorm2d in ConvNeXt
    moves the channels last and back; swapped, its (N, C, H, W) input met a weight of C over
    W: the trial crashed). The kernel normalizes over the last dimension only: a LayerNorm
    over several (nn.LayerNorm([C, H, W])) is left too."""
    return (isinstance(module, nn.LayerNorm) and module.weight is not None
            and len(module.normalized_shape) == 1
            and type(module).forward is nn.LayerNorm.forward)


def first_replacements(model: nn.Module, chosen: set[str]) -> dict[str, tuple[nn.Module, ...]]:
    """For each kernel, the first module it would replace: (parent, module, replacement)."""
    found: dict[str, tuple[nn.Module, ...]] = {}
    for parent in model.modules():
        for child in parent.children():
            replacement = replacement_for(child, chosen)
            if replacement and replacement[0] not in found:
                found[replacement[0]] = (parent, child, replacement[1])
    return found


_NOT_FOUND = {
    "causal_softmax": "no manual causal softmax (gputune's built-in models mark theirs)",
    "layer_norm": "no nn.LayerNorm over the last dimension with its own forward",
    "rms_norm": "no RMSNorm computing x / rms(x) * weight",
    "gelu": "no tanh-approximated GELU",
    "swiglu": "no gated SiLU MLP (gate_proj, up_proj, down_proj, act_fn)",
    "cross_entropy": "no vocabulary head whose loss gputune computes",
    "linear_cross_entropy": "no vocabulary head whose loss gputune computes",
}


def inapplicable(model: nn.Module, blocks) -> dict[str, str]:
    """The kernels (`fused_kernels=KERNEL`) that find nothing to replace in `model`; the whole
    option where none does. Found as `apply` finds them, on every module."""
    modules = list(model.modules())
    found = {kernel for kernel in FUSED_KERNEL_CHOICES
             if any(replacement_for(m, {kernel}) for m in modules)}
    causal_lms = [m for m in modules if hf_causal_lm_loss.output_head(m) is not None]
    if any(hf_causal_lm_loss.why_not_swappable(m) is None for m in causal_lms):
        found.add("linear_cross_entropy")
    out = {f"fused_kernels={k}": _NOT_FOUND[k] for k in FUSED_KERNEL_CHOICES if k not in found}
    if "linear_cross_entropy" in found and "cross_entropy" not in found:
        out["fused_kernels=cross_entropy"] = ("a Hugging Face model's loss is swapped only by "
                                              "linear_cross_entropy")
    elif causal_lms and "linear_cross_entropy" not in found:
        why = hf_causal_lm_loss.why_not_swappable(causal_lms[0])
        out["fused_kernels=linear_cross_entropy"] = f"the model's own loss is kept ({why})"
    if not found:
        why = "no module that any kernel replaces"
        out = {"fused_kernels": why, "kernels_with_compile": why}
    return out


def measured_choice(run, config, chosen: set[str], timings=None) -> tuple[set[str], dict[str, str]]:
    """`chosen` less the kernels measured slower than the module they replace (unless
    kernels_with_compile = forced), and a line per kernel saying kept or left and why.
    `timings` is a strategies.kernel_timing.TimingSource; by default the per-GPU cache on CUDA,
    and no timing on the CPU, where the interpreter's timings mean nothing."""
    from strategies import kernel_timing

    if timings is None:
        if run.device_type != "cuda":
            return chosen, {}
        timings = kernel_timing.cached_timings
    cases, measured = [], {}
    for kernel, (parent, module, new) in first_replacements(run.model, chosen).items():
        case = kernel_timing.make_case(kernel, parent, module, new, run.model, run.autocast_dtype)
        if isinstance(case, str):
            measured[kernel] = case
        else:
            cases.append(case)
    measured.update(timings(cases))
    kept, lines = set(chosen), {}
    forced = config.kernels_with_compile == "forced"
    for kernel in sorted(measured):
        keep, lines[kernel] = kernel_timing.verdict(measured[kernel], forced)
        if not keep:
            kept.discard(kernel)
    return kept, lines


def swap_modules(model: nn.Module, chosen: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            found = replacement_for(child, chosen)
            if found:
                kernel, new = found
                setattr(parent, name, new)
                counts[kernel] = counts.get(kernel, 0) + 1
    return counts


def apply(run, config, timings=None) -> None:
    """Swap the chosen kernels in; on CUDA (or with `timings` given) only those measured no
    slower than what they replace (see `measured_choice`)."""
    chosen = set(config.fused_kernels)
    if not chosen:
        run.report["fused_kernels"] = {}
        return
    # Under compile (inductor-first) the kernels Inductor fuses itself are left to it.
    chosen = set(config.effective_kernels())
    left_to_inductor = [k for k in config.fused_kernels if k not in chosen]
    import gputune_kernels

    ok, reason = gputune_kernels.available()
    if not ok:
        raise ConfigError(f"fused_kernels = [{', '.join(config.fused_kernels)}] cannot run: {reason}")
    if run.device_type == "cuda":
        # The C++ autograd nodes (gputune_kernels._native) take the eager calls once built: wait
        # for the build (once per machine, then cached), so that the kernels are timed, and the
        # steps measured, as they will run.
        from gputune_kernels import _native

        started = time.perf_counter()
        run.report["fused_kernels_native"] = _native.wait(timeout=600)
        run.report["fused_kernels_native_wait_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    chosen, measured = measured_choice(run, config, chosen, timings)
    if measured:  # (a build's one-time parts: an H100's first trial with kernels built 25 s)
        run.report["fused_kernels_timing_s"] = round(time.perf_counter() - started, 2)
    counts = swap_modules(run.model, chosen) if chosen else {}
    not_swapped = None
    if "linear_cross_entropy" in chosen:
        # Hugging Face causal LMs compute their loss inside forward(labels=...): no module to
        # swap, so their forward is wrapped (strategies/hf_causal_lm_loss.py).
        swapped = hf_causal_lm_loss.swap_losses(run.model)
        if swapped:
            counts["linear_cross_entropy"] = counts.get("linear_cross_entropy", 0) + swapped
        elif hf_causal_lm_loss.output_head(run.model) is not None:
            why = hf_causal_lm_loss.why_not_swappable(run.model)
            not_swapped = f"linear_cross_entropy: the model's own loss is kept ({why})"
    # Say what was asked for but not found, so a user sees why a kernel made no difference.
    run.report["fused_kernels"] = {k: counts.get(k, 0) for k in config.fused_kernels}
    run.report["fused_kernels_left"] = unswapped_candidates(run.model)
    if not_swapped:
        run.report["fused_kernels_not_swapped"] = not_swapped
    if left_to_inductor:
        run.report["fused_kernels_left_to_inductor"] = left_to_inductor
    if measured:
        run.report["fused_kernels_measured"] = measured


# Class-name endings of modules that look like norms or activations we could not swap (for
# example Hugging Face's NewGELUActivation or a plain nn.SiLU inside an MLP's forward).
_LOOKS_FUSABLE = ("Norm", "GELU", "Activation", "SiLU", "Softmax")


def unswapped_candidates(model: nn.Module) -> dict[str, int]:
    left: dict[str, int] = {}
    ours = (FusedLayerNorm, FusedRMSNorm, FusedGeluTanh, FusedSiluMul, FusedCausalSoftmax,
            FusedGatedMLP)
    for m in model.modules():
        name = type(m).__name__
        # (a LayerNorm subclass with a forward of its own, e.g. LayerNorm2d, counts too)
        if not isinstance(m, ours) and (name.endswith(_LOOKS_FUSABLE)
                                        or isinstance(m, nn.LayerNorm)):
            left[name] = left.get(name, 0) + 1
    return left

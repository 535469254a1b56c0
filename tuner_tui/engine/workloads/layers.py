"""Building blocks shared by the built-in models.

Each block that a fused kernel can replace is its own small module and carries a
`gputune_kernel` attribute naming that kernel: the fused-kernels strategy swaps any module so
marked (ours or a user's) for the kernel's module, and plain `nn.LayerNorm` / `nn.RMSNorm` /
`nn.GELU(approximate="tanh")` are recognised by type.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSoftmax(nn.Module):
    """softmax(scale * scores) with future positions masked: the manual attention path."""

    gputune_kernel = "causal_softmax"

    def forward(self, scores: torch.Tensor, scale: float) -> torch.Tensor:
        t = scores.size(-1)
        mask = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
        scores = (scores * scale).masked_fill(~mask, float("-inf"))
        return F.softmax(scores, dim=-1)


class SiluMul(nn.Module):
    """silu(gate) * up, the SwiGLU product."""

    gputune_kernel = "swiglu"

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class LMHeadLoss(nn.Module):
    """Cross-entropy of hidden @ weight.T against targets. Kept as one module so that the fused
    kernels can replace it by a chunked linear + cross-entropy that never builds the logits."""

    gputune_kernel = "linear_cross_entropy"

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
        logits = hidden @ weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str, softmax: nn.Module
) -> torch.Tensor:
    """Causal attention over (batch, heads, time, head_dim) tensors."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    probs = softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(q.size(-1)))
    return probs.to(v.dtype) @ v

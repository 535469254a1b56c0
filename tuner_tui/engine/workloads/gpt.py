"""A GPT-2-style decoder (LayerNorm, learned positions, tanh-GELU MLP, tied embeddings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tuner_tui.engine.workloads.layers import CausalSoftmax, LMHeadLoss, attention


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64, as nanoGPT does
    block_size: int = 1024
    #: The loss is taken of the logits in their own dtype (`layers.LMHeadLoss`), not of an fp32
    #: copy as HF's causal LMs take it (`ModelShape.loss_in_fp32`).
    loss_in_fp32 = False


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.n_head = shape.n_head
        self.c_attn = nn.Linear(shape.n_embd, 3 * shape.n_embd)
        self.c_proj = nn.Linear(shape.n_embd, shape.n_embd)
        self.softmax = CausalSoftmax()
        self.attention_impl = "manual"
        """"manual" or "sdpa"; set by the attention strategy."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = attention(q, k, v, self.attention_impl, self.softmax)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.c_fc = nn.Linear(shape.n_embd, 4 * shape.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * shape.n_embd, shape.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.n_embd)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd)
        self.loss = LMHeadLoss()
        self._init_weights(shape)

    def _init_weights(self, shape: GPTShape) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02
                if name.endswith("c_proj.weight"):  # GPT-2's scaled residual init
                    std = 0.02 / (2 * shape.n_layer) ** 0.5
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        # Tied embeddings: the output projection is the token embedding matrix.
        return self.loss(x.view(-1, x.size(-1)), self.wte.weight, targets.reshape(-1))


def flops_per_token(shape: GPTShape, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per parameter plus attention's score and value matmuls
    (PaLM appendix B, as nanoGPT's estimate_mfu)."""
    head_dim = shape.n_embd // shape.n_head
    return 6 * n_params + 12 * shape.n_layer * shape.n_head * head_dim * seq_len

"""A Llama-style decoder: RMSNorm, SwiGLU MLP, rotary position embeddings, grouped-query
attention, untied output head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tuner_tui.engine.workloads.layers import CausalSoftmax, LMHeadLoss, SiluMul, attention


@dataclass(frozen=True)
class LlamaShape:
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_hidden: int
    vocab_size: int = 32000
    block_size: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    #: Attention repeats keys and values to every query head before SDPA (what the memory
    #: model's prior needs to know, `ModelShape.kv_repeated`).
    repeats_kv = True
    #: The loss is taken of the logits in their own dtype (`layers.LMHeadLoss`), not of an fp32
    #: copy as HF's causal LMs take it (`ModelShape.loss_in_fp32`).
    loss_in_fp32 = False


def rotary_tables(head_dim: int, seq_len: int, theta: float, device) -> tuple[torch.Tensor, ...]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, time, head_dim); rotate pairs (even, odd) by the position's angle.
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = shape.n_head, shape.n_kv_head
        self.head_dim = shape.n_embd // shape.n_head
        self.wq = nn.Linear(shape.n_embd, shape.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(shape.n_embd, shape.n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(shape.n_embd, shape.n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(shape.n_head * self.head_dim, shape.n_embd, bias=False)
        self.softmax = CausalSoftmax()
        self.attention_impl = "manual"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Grouped-query attention: each key/value head serves n_head // n_kv_head query heads.
        repeat = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = attention(q, k, v, self.attention_impl, self.softmax)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.w_gate = nn.Linear(shape.n_embd, shape.ffn_hidden, bias=False)
        self.w_up = nn.Linear(shape.n_embd, shape.ffn_hidden, bias=False)
        self.w_down = nn.Linear(shape.ffn_hidden, shape.n_embd, bias=False)
        self.act = SiluMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(self.act(self.w_gate(x), self.w_up(x)))


class Block(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(shape.n_embd, eps=shape.norm_eps)
        self.attn = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.n_embd, eps=shape.norm_eps)
        self.ffn = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.norm = nn.RMSNorm(shape.n_embd, eps=shape.norm_eps)
        self.output = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.loss = LMHeadLoss()
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        cos, sin = rotary_tables(
            self.shape.n_embd // self.shape.n_head, t, self.shape.rope_theta, idx.device
        )
        x = self.tok_embeddings(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.norm(x)
        return self.loss(x.view(-1, x.size(-1)), self.output.weight, targets.reshape(-1))


def flops_per_token(shape: LlamaShape, n_params: int, seq_len: int) -> float:
    head_dim = shape.n_embd // shape.n_head
    return 6 * n_params + 12 * shape.n_layer * shape.n_head * head_dim * seq_len

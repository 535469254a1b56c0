"""A plain hand-written model: the smallest complete workload, to copy for your own.

    gputune bench --workload examples.plain_model:mlp --device cpu
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tuner_tui.engine.workloads import Workload


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 256, depth: int = 6, classes: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width),
                          nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def mlp(device: str = "cpu", seed: int = 0) -> Workload:
    width = 1024 if device == "cuda" else 64

    def batch(step: int, batch_size: int, dev: torch.device):
        g = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + step)
        x = torch.randn(batch_size, width, generator=g, device=dev)
        return x, x[:, :16].argmax(dim=1)

    def loss(model, b):
        x, y = b
        return F.cross_entropy(model(x), y)

    def flops(model):
        return 6 * sum(p.numel() for p in model.parameters())

    return Workload(
        name="residual-mlp", build_model=lambda: ResidualMLP(width), batch=batch,
        items_per_sample=1, default_batch_size=4096 if device == "cuda" else 64, loss=loss,
        flops_per_item=flops, item_name="samples",
    )

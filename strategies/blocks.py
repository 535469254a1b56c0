"""Finding a model's repeated blocks, for per-block checkpointing and per-block compile."""

from __future__ import annotations

from torch import nn


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer (or other repeated) blocks: the largest `nn.ModuleList` whose
    children all have one type. Empty if the model has none."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            children = list(module)
            if children and all(type(c) is type(children[0]) for c in children):
                best = children
    return best

"""Finding a model's repeated blocks, for per-block checkpointing and per-block compile."""

from __future__ import annotations

from torch import nn


def _largest_uniform(model: nn.Module, container: type) -> list[nn.Module]:
    best: list[nn.Module] = []
    for module in model.modules():
        if type(module) is container and len(module) > max(len(best), 1):
            children = list(module)
            if all(type(c) is type(children[0]) for c in children):
                best = children
    return best


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer (or other repeated) blocks: the largest `nn.ModuleList` whose
    children all have one type (at least two), else the largest such `nn.Sequential` (a
    ResNet stage, say). Empty if the model has none; a workload can then name its blocks."""
    return _largest_uniform(model, nn.ModuleList) or _largest_uniform(model, nn.Sequential)


def block_shapes(block: nn.Module) -> tuple:
    """What tells one block from another to torch.compile: its type and the shapes of its
    parameters and buffers (a meta-device copy will do)."""
    tensors = [*block.named_parameters(), *block.named_buffers()]
    return (type(block), tuple((name, tuple(t.shape)) for name, t in tensors))


def shape_kinds(blocks: list[nn.Module]) -> int:
    """How many differently shaped blocks there are: one in a transformer; eight in
    ResNet-50, whose four stages differ in width and each open with a downsampling block."""
    return len({block_shapes(b) for b in blocks})

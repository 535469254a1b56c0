"""An image classifier's workload: synthetic images of the model's input size, a label each
that the image decides, cross-entropy over the model's classes. Shared by the vision kinds."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tuner_tui.engine.workloads import Workload


def logits_of(output) -> torch.Tensor:
    """The logits of a classifier's output: a tensor, or the `.logits` (or first item) of the
    auxiliary-head outputs some models return while training (Inception, GoogLeNet)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else output[0]


def synthetic_images(seed: int, channels: int, height: int, width: int, classes: int):
    """`batch(step, batch_size, device)`: the same images and labels for the same arguments.
    A label is decided by the signs of the image's channel means (up to 8 classes, spread over
    the model's), so there is something to learn."""
    spread = max(1, classes // 8)

    def batch(step: int, batch_size: int, device: torch.device):
        g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)
        images = torch.randn(batch_size, channels, height, width, generator=g, device=device)
        signs = (images.mean(dim=(2, 3))[:, :3] > 0).long()
        code = sum(signs[:, i] << i for i in range(signs.shape[1]))
        return images, (code * spread) % classes

    return batch


def classification_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(logits_of(model(images)), labels)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks to checkpoint or compile one by one: every child of the most common type
    among the children of containers that hold one type (a ResNet's bottlenecks across its
    four stages, a ViT's encoder blocks). Empty where there are none."""
    members: dict[type, list[nn.Module]] = {}
    for module in model.modules():
        if not isinstance(module, (nn.Sequential, nn.ModuleList)) or len(module) < 2:
            continue
        children = list(module)
        kind = type(children[0])
        if kind in (nn.Sequential, nn.ModuleList) or any(type(c) is not kind for c in children):
            continue
        members.setdefault(kind, []).extend(children)
    return max(members.values(), key=len, default=[])


def training_flops_per_image(build: Callable[[], nn.Module], channels: int, height: int,
                             width: int, classes: int) -> float | None:
    """A training step's FLOPs per image (forward and backward), counted by torch's
    FlopCounterMode on a copy on the meta device (no memory, no compute); None where the model
    does not run there."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            model = build()
            # Two images: batch norm refuses one per channel in training.
            images = torch.empty(2, channels, height, width)
            labels = torch.zeros(2, dtype=torch.long)
        model.train()
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(logits_of(model(images)), labels).backward()
        return counter.get_total_flops() / 2
    except Exception:  # the count is a nicety: without it, no MFU
        return None


def image_workload(name: str, build: Callable[[], nn.Module], input_size: tuple[int, int, int],
                   classes: int, seed: int, device: str) -> Workload:
    """`input_size`: (channels, height, width)."""
    channels, height, width = input_size
    flops = training_flops_per_image(build, channels, height, width, classes)
    return Workload(
        name=name,
        build_model=build,
        batch=synthetic_images(seed, channels, height, width, classes),
        items_per_sample=1,
        item_name="images",
        default_batch_size=64 if device == "cuda" else 8,
        loss=classification_loss,
        flops_per_item=None if flops is None else (lambda model: flops),
        blocks=repeated_blocks,
    )

"""A convolutional image classifier on synthetic images.

    gputune bench --workload examples.vision_cnn:resnet --device cpu

Uses torchvision's ResNet-18 where torchvision imports, and a small hand-written ResNet
otherwise (PyPI's torchvision does not import beside every torch build). Throughput is in
images per second; the residual blocks are named for checkpointing and per-block compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tuner_tui.engine.workloads import Workload


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    def __init__(self, channels: int = 32, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(BasicBlock(channels) for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def _torchvision_resnet18():
    try:
        from torchvision.models import resnet18
    except Exception:  # not installed, or built for another torch
        return None
    return lambda: resnet18(num_classes=10)


def resnet(device: str = "cpu", seed: int = 0) -> Workload:
    size = 224 if device == "cuda" else 32
    build = _torchvision_resnet18() if device == "cuda" else None
    name = "resnet18" if build else "small-resnet"
    build = build or (lambda: SmallResNet())

    def batch(step: int, batch_size: int, dev: torch.device):
        g = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + step)
        images = torch.randn(batch_size, 3, size, size, generator=g, device=dev)
        # Labels that depend on the image, so there is something to learn.
        labels = (images[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (images[:, 1].mean(dim=(1, 2)) > 0).long()
        return images, labels

    def loss(model, b):
        images, labels = b
        return F.cross_entropy(model(images), labels)

    def blocks(model):
        if isinstance(model, SmallResNet):
            return list(model.blocks)
        return [blk for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for blk in layer]

    return Workload(
        name=name, build_model=build, batch=batch, items_per_sample=1,
        default_batch_size=128 if device == "cuda" else 16, loss=loss, item_name="images",
        blocks=blocks,
    )

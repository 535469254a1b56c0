"""Workloads given as module:function, for the tests (a user's own model is built this way)."""

import weakref

import torch
from torch import nn

from tuner_tui.engine.workloads import Workload


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _batch(step, batch_size, device):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 16, generator=g)
    return x.to(device), (x[:, :4].argmax(1)).to(device)


def tiny_mlp():
    return Workload(name="tiny-mlp", build_model=TinyMLP, batch=_batch, items_per_sample=1,
                    default_batch_size=32, item_name="samples")


def tiny_mlp_batch_8():
    """tiny_mlp at gpt2-tiny's default batch (8): for the tests of what is refused once the
    worker has loaded the workload (its default batch known), whose messages name the batch. Its
    worker is up in about half the time gpt2-tiny's takes."""
    return Workload(name="tiny-mlp", build_model=TinyMLP, batch=_batch, items_per_sample=1,
                    default_batch_size=8, item_name="samples")


def frozen_mlp():
    """tiny_mlp with every parameter frozen: its own backward fails, whatever gputune changes."""
    def build():
        return TinyMLP().requires_grad_(False)

    return Workload(name="frozen-mlp", build_model=build, batch=_batch, items_per_sample=1,
                    default_batch_size=8, item_name="samples")


class Exploding(TinyMLP):
    def forward(self, x, y):
        loss = super().forward(x, y)
        # From the third call on, the loss is not finite: a diverging run.
        self.calls = getattr(self, "calls", 0) + 1
        return loss * float("inf") if self.calls >= 3 else loss


def exploding():
    return Workload(name="exploding", build_model=Exploding, batch=_batch, items_per_sample=1,
                    default_batch_size=8)


def not_a_workload():
    return {"model": "nope"}


def raises():
    raise RuntimeError("dataset server unreachable")


class DataDependent(TinyMLP):
    def forward(self, x, y):
        # Python control flow on a tensor's value: a graph break under torch.compile.
        if x.sum().item() > 0:
            x = x * 2
        return super().forward(x, y)


def graph_break():
    return Workload(name="graph-break", build_model=DataDependent, batch=_batch,
                    items_per_sample=1, default_batch_size=8)


class ShapeOfTheDay(TinyMLP):
    """Reads a Python number that changes every call: each call fails Dynamo's guards."""

    def forward(self, x, y):
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x * self.calls, y)


def recompiles():
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 1  # reach the limit on the first recompile
    return Workload(name="recompiles", build_model=ShapeOfTheDay, batch=_batch,
                    items_per_sample=1, default_batch_size=8)


HELD_BY_FAILED_STEP: list = []
"""Weak references to what the failing step below held when it raised."""


class OutOfMemoryInStep(TinyMLP):
    def forward(self, x, y):
        held = torch.empty(256, 256)  # what a real step holds when the allocator gives out
        HELD_BY_FAILED_STEP.append(weakref.ref(held))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. (raised by "
                                     "the test workload)")


class TransientPeak(TinyMLP):
    TRANSIENT = 256 << 20

    def forward(self, x, y):
        # Held only within the forward, as a large model's logits are within its step
        scratch = torch.ones(self.TRANSIENT // 4)
        return super().forward(x, y) + 0 * scratch[0]


def transient_peak():
    return Workload(name="transient-peak", build_model=TransientPeak, batch=_batch,
                    items_per_sample=1, default_batch_size=8, item_name="samples")


def oom_in_step():
    return Workload(name="oom-in-step", build_model=OutOfMemoryInStep, batch=_batch,
                    items_per_sample=1, default_batch_size=8)



class TinyScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, h):
        return torch.tanh(h * self.weight + self.bias)


class ManyTinyOps(nn.Module):
    """Hundreds of small modules on four numbers per sample: the step's time goes to Python and
    to launching ops, not to arithmetic. The model a host-bound profile is made of."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(TinyScale() for _ in range(64))

    def forward(self, x, y):
        h = x[:, :4]
        for layer in self.layers:
            h = layer(h)
        return nn.functional.cross_entropy(h, y)


def many_tiny_ops():
    # Ops on four numbers gain nothing from a second thread; on a loaded machine its wake-ups
    # would stall every op and hide where the time goes.
    torch.set_num_threads(1)
    return Workload(name="many-tiny-ops", build_model=ManyTinyOps, batch=_batch,
                    items_per_sample=1, default_batch_size=2, item_name="samples")


def sleeps():
    import time

    time.sleep(600)  # a dataset server that never answers


def negative_items():
    return Workload(name="tiny-mlp", build_model=TinyMLP, batch=_batch, items_per_sample=-5,
                    default_batch_size=32)


def zero_batch():
    return Workload(name="tiny-mlp", build_model=TinyMLP, batch=_batch, items_per_sample=1,
                    default_batch_size=0)


def builds_nothing():
    return Workload(name="tiny-mlp", build_model=lambda: None, batch=_batch, items_per_sample=1,
                    default_batch_size=32, item_name="samples")


def no_first_batch():
    return Workload(name="tiny-mlp", build_model=TinyMLP, batch=lambda step, size, device: None,
                    items_per_sample=1, default_batch_size=32)


class OutOfMemoryAfterOneStepInFp32(TinyMLP):
    """Runs out of memory from its second forward on where nothing autocasts (the fp32
    reference, however it is checkpointed or split): a reference that fails part way, after one
    loss."""

    def __init__(self):
        super().__init__()
        self.forwards = 0

    def forward(self, x, y):
        self.forwards += 1
        if self.forwards > 1 and not torch.is_autocast_enabled(x.device.type):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. "
                                         "(raised by the test workload)")
        return super().forward(x, y)


def oom_after_one_fp32_step():
    return Workload(name="oom-after-one-fp32-step", build_model=OutOfMemoryAfterOneStepInFp32,
                    batch=_batch, items_per_sample=1, default_batch_size=8)


def dies_as_it_builds():
    """The worker's process ends as the workload loads (a library that aborts, an os._exit)."""
    import os

    os._exit(3)

"""Micro-batches of a model with BatchNorm: each micro-batch is normalized by its own statistics,
so the run is another training than the whole batch's. The model's description says so, the
gradient gate's refusal names it, and the search holds the micro-batch at the whole batch."""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from strategies.applicability import training_changing_options
from strategies.config import TuneConfig
from tuner_tui.engine.reference_gradients import reference_gradients
from tuner_tui.engine.search.expert import memory_moves
from tuner_tui.engine.search.moves import SingleMoves
from tuner_tui.engine.search.space import default_space
from tuner_tui.engine.trial import Trainer
from tuner_tui.engine.workloads import Workload
from search_cases import CPU


def cnn(norm) -> Workload:
    def build():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, padding=1), norm(8), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def batch(step, n, device):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(n, 3, 12, 12, generator=g)
        return x.to(device), (x[:, 0].mean((1, 2)) > 0).long().to(device)

    return Workload(name="norm-cnn", build_model=build, batch=batch, items_per_sample=1,
                    default_batch_size=16, loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    item_name="images")


def test_batchnorm_and_only_batchnorm_makes_micro_batches_change_the_training():
    found = training_changing_options(cnn(nn.BatchNorm2d).describe())
    assert list(found) == ["micro_batch_size"] and "2 BatchNorm layers" in found["micro_batch_size"]
    # Normalizations within each sample leave accumulation exact.
    for per_sample in (lambda c: nn.GroupNorm(2, c), nn.InstanceNorm2d, nn.Identity):
        assert training_changing_options(cnn(per_sample).describe()) == {}


def run(workload, config, reference):
    trainer = Trainer(workload=workload, config=config, device="cpu", seed=0, warmup_steps=1,
                      reference_gradients=reference)
    trainer.build()
    for _ in range(3):
        trainer.step()
    trainer.finish()
    result = trainer.result()
    trainer.close()
    return result


def test_the_gate_refuses_micro_batches_under_batchnorm_and_names_why():
    workload = cnn(nn.BatchNorm2d)
    reference = reference_gradients(workload, 16, 0, "cpu")
    whole = run(workload, TuneConfig.reference(16), reference)
    assert whole.status == "ok", whole.message
    micro = run(workload, TuneConfig.reference(16).replace(micro_batch_size=4), reference)
    assert micro.status == "numerics"
    assert "micro_batch_size: its 2 BatchNorm layers would normalize each micro-batch" \
        in micro.message
    # Where nothing of the model is coupled across the batch, the same split passes.
    plain = cnn(lambda c: nn.GroupNorm(2, c))
    same = run(plain, TuneConfig.reference(16).replace(micro_batch_size=4),
               reference_gradients(plain, 16, 0, "cpu"))
    assert same.status == "ok" and "BatchNorm" not in same.message


def test_the_search_holds_the_micro_batch_at_the_whole_batch_unless_asked_for():
    why = {"micro_batch_size": "its 2 BatchNorm layers would normalize each micro-batch ..."}
    free = default_space(CPU, 16)
    held = default_space(CPU, 16, changes_training=why)
    assert free.held == () and held.held == ("micro_batch_size",)
    start = held.start()
    assert free.micro_batches(start) == [0, 8, 4, 2, 1] and held.micro_batches(start) == [0]
    # No move accumulates micro-batches, the batch grown or memory short alike,
    accumulating = start.replace(batch_size=64, micro_batch_size=16)
    assert held.canonical(accumulating) == start.replace(batch_size=64)
    moves = [c for _, c in SingleMoves(held).singles(start)] + \
        [c for _, c in memory_moves(held, start)]
    assert moves and all(c.micro_batch_size == 0 for c in moves)
    assert any(c.micro_batch_size for _, c in SingleMoves(free).singles(start))
    # unless the user searches it, or holds it.
    asked = default_space(CPU, 16, choices={"micro_batch_size": (0, 4)}, changes_training=why)
    assert asked.held == () and asked.micro_batches(asked.start()) == [0, 4]
    fixed = default_space(CPU, 16, fixed={"micro_batch_size": 4}, changes_training=why)
    assert fixed.held == () and fixed.start().micro_batch_size == 4


def test_the_reference_of_a_batchnorm_model_is_never_split_into_micro_batches():
    # (where the whole batch does not fit, the reference falls back to micro-batches: under
    # BatchNorm that is another training, which would refuse every whole-batch run)
    def short_of_memory(workload):
        def loss(model, batch):
            if batch[0].shape[0] > 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB.")
            return workload.loss(model, batch)
        return dataclasses.replace(workload, loss=loss)

    assert reference_gradients(short_of_memory(cnn(nn.BatchNorm2d)), 16, 0, "cpu") is None
    split = reference_gradients(short_of_memory(cnn(lambda c: nn.GroupNorm(2, c))), 16, 0, "cpu")
    assert split is not None

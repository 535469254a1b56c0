"""The trainer's micro-batches (gradient accumulation) and the memory parts it measures."""

import pytest
import torch

from strategies import ConfigError, TuneConfig
from tuner_tui.engine import protocol as P
from tuner_tui.engine.trial import Trainer
from tuner_tui.engine.workloads import load


def _run(changes: dict, steps: int = 3) -> Trainer:
    trainer = Trainer(workload=load("gpt2-tiny"), config=TuneConfig.from_dict(changes),
                      device="cpu", warmup_steps=1)
    trainer.build()
    for _ in range(steps):
        trainer.step()
    trainer.finish()
    return trainer


def test_micro_batches_train_like_the_whole_batch_and_count_optimizer_steps():
    whole = _run({})
    micro = _run({"micro_batch_size": 2})  # the default batch of 8 in 4 micro-batches
    assert micro.accumulation_steps == 4 and micro.batch_size == 8
    assert [r.step for r in micro.records] == [0, 1, 2]  # one record per optimizer step
    assert micro.items_per_step() == whole.items_per_step() == 8 * 64  # tokens of the whole batch
    for got, want in zip(micro.records, whole.records):
        # The same gradients (up to summation order), so the same updates and losses.
        assert got.loss == pytest.approx(want.loss, rel=1e-5)
    result = micro.result()
    assert result.status == "ok" and result.batch_size == 8
    assert result.config["micro_batch_size"] == 2 and "micro 2" in result.label


def test_a_micro_batch_that_does_not_divide_the_default_batch_is_refused_before_building():
    with pytest.raises(ConfigError, match="micro_batch_size = 3 does not divide batch_size = 8"):
        Trainer(workload=load("gpt2-tiny"), config=TuneConfig.from_dict({"micro_batch_size": 3}),
                device="cpu")


def _unique_parameter_bytes(model) -> int:
    seen = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(seen.values())


def test_memory_parts_count_parameters_gradients_and_state_once():
    trainer = _run({}, steps=1)
    parts = trainer.result().memory_parts
    model = trainer.tuned.model
    params = _unique_parameter_bytes(model)
    tensors = len(list(model.parameters()))
    n = sum(p.numel() for p in model.parameters())
    assert params == 4 * n  # tied weights appear once in parameters() and are counted once
    assert parts["parameters"] == params
    assert parts["gradients"] == params  # every parameter has an fp32 gradient after a step
    # AdamW: two fp32 moments per parameter, and a scalar fp32 step per tensor (on the CPU).
    assert parts["optimizer_state"] == 2 * params + 4 * tensors
    assert P.TrialResult.from_dict(trainer.result().to_dict()).memory_parts == parts


def test_a_trial_that_fails_in_its_first_step_still_reports_the_parameters():
    # An out-of-memory first step leaves the search the parameter count, from which the model's
    # shapes estimate the next trial's peak (an fp32 reference far past the device is not run).
    trainer = Trainer(workload=load("gpt2-tiny"), config=TuneConfig.from_dict({}), device="cpu",
                      warmup_steps=1)
    trainer.build()
    failed = trainer.result(status="oom", message="out of memory")
    n = sum(p.numel() for p in trainer.tuned.model.parameters())
    assert failed.memory_parts["parameters"] == 4 * n
    assert failed.memory_parts["gradients"] == failed.memory_parts["optimizer_state"] == 0
    # and how many shapes torchao's AdamW would compile its step for (gpt2-tiny: the embeddings
    # and positions, the norms' vector, the attention's and MLP's weights and biases)
    shapes = {tuple(p.shape) for p in trainer.tuned.model.parameters()}
    assert failed.parameter_shapes == len(shapes) >= 5
    assert P.TrialResult.from_dict(failed.to_dict()).parameter_shapes == failed.parameter_shapes


def test_memory_parts_of_bf16_weights_with_8bit_state():
    import strategies
    from tuner_tui.engine.memory_parts import memory_parts

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    config = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "optimizer_state": "8bit"})
    tuned = strategies.apply(config, model, torch.optim.AdamW(model.parameters()))
    with tuned.autocast():
        loss = tuned.model(torch.randn(4, 64)).float().square().mean()
    tuned.step(loss, zero_grad=False)
    parts = memory_parts(tuned.model, tuned.optimizer, torch.device("cpu"))
    n = sum(p.numel() for p in model.parameters())  # 4680, of which 4096 in the 8-bit tensor
    assert parts["parameters"] == parts["gradients"] == 2 * n
    # The 64x64 weight's two moments (torchao's 8-bit state): 8-bit codes (2 x 4096 bytes), an
    # fp32 scale per block of 256 (2 x 16 x 4) and a 256-entry fp32 code map each; the three
    # smaller tensors keep bf16 moments (2 x 584 x 2 bytes); a scalar fp32 step per tensor.
    codes, scales, maps = 2 * 4096, 2 * 16 * 4, 2 * 256 * 4
    small, steps = 2 * (n - 4096) * 2, 4 * 4
    assert parts["optimizer_state"] == codes + scales + small + steps + maps


def test_a_frozen_backbone_s_parameters_hold_no_gradients_or_state_and_are_counted_apart():
    import strategies
    from tuner_tui.engine.memory_parts import memory_parts

    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
    backbone.requires_grad_(False)
    model = torch.nn.Sequential(backbone, head)
    tuned = strategies.apply(TuneConfig(), model,
                             torch.optim.AdamW(p for p in model.parameters() if p.requires_grad))
    tuned.step(tuned.model(torch.randn(4, 64)).square().mean(), zero_grad=False)
    parts = memory_parts(tuned.model, tuned.optimizer, torch.device("cpu"))
    assert parts["parameters"] == 4 * (64 * 64 + 64 + 64 * 8 + 8)
    assert parts["trainable"] == parts["gradients"] == 4 * (64 * 8 + 8)

"""The loss check and the gradient gate of a model with its own randomness (dropout): a compiled
or micro-batched run draws other masks than the eager reference, so its losses and gradients
differ whatever its numerics; the reference measures how far (`reference_gradients.loss_spread`,
the widest wobble over several backward passes) and the checks allow for it."""

import torch
import torch.nn.functional as F
from torch import nn

from strategies.config import TuneConfig
from tuner_tui.engine import workloads
from tuner_tui.engine.reference import LOSS_CHECK_STEPS
from tuner_tui.engine.reference_gradients import reference_check
from tuner_tui.engine.trial import LOSS_TOLERANCE, Trainer
from tuner_tui.engine.workloads import Workload


def dropout_mlp(p: float = 0.3) -> Workload:
    width = 64

    def build():
        return nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Dropout(p),
                             nn.Linear(4 * width, width), nn.ReLU(), nn.Dropout(p),
                             nn.Linear(width, 10))

    def batch(step, n, device):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(n, width, generator=g)
        return x.to(device), x[:, :10].argmax(1).to(device)

    return Workload(name="dropout-mlp", build_model=build, batch=batch, items_per_sample=1,
                    default_batch_size=64, loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    item_name="samples")


def losses(workload, config, spread=None, reference=(), gradients=None):
    trainer = Trainer(workload=workload, config=config, device="cpu", seed=0,
                      reference_losses=tuple(reference), reference_loss_spread=spread,
                      reference_gradients=gradients)
    trainer.build()
    for _ in range(LOSS_CHECK_STEPS):
        trainer.step()
    trainer.finish()
    found = [r.loss for r in trainer.records], trainer.loss_check(), trainer.gradient_check
    trainer.close()
    return found


def test_a_deterministic_model_has_no_spread_and_keeps_fp32_s_tolerance():
    workload = workloads.load("gpt2-tiny", None, 0, None, "cpu")
    gradients, spread = reference_check(workload, 8, 0, "cpu")
    assert spread == 0.0
    # its wobble is rounding's alone: the gate stays as tight as it was
    assert max(s.wobble for s in gradients.values()) < 1e-3


def test_micro_batches_of_a_model_with_dropout_pass_with_the_spread_its_reference_measured():
    workload = dropout_mlp()
    gradients, spread = reference_check(workload, 64, 0, "cpu")
    assert spread > LOSS_TOLERANCE["fp32"] / 10  # dropout of 0.3 moves the loss
    reference, _, _ = losses(workload, TuneConfig.reference(64))
    micro = TuneConfig.reference(64).replace(micro_batch_size=16)
    # Without the spread, fp32's 0.2% refuses the same computation on other masks (as it was);
    _, (ok, worst, tolerance), _ = losses(workload, micro, None, reference)
    assert ok is False and tolerance == LOSS_TOLERANCE["fp32"] and worst > tolerance
    # with it, the tolerance is the spread's, and the run passes, its gradients too.
    _, (ok, worst, tolerance), check = losses(workload, micro, spread, reference, gradients)
    assert ok is True and tolerance > LOSS_TOLERANCE["fp32"] and worst <= tolerance
    assert check is not None and check.ok is not False, check

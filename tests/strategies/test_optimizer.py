"""The optimizer choice is made on the user's optimizer in place, so an LR scheduler made before
`strategies.apply` drives the optimizer that steps."""

import warnings

import pytest
import torch
from torch import nn

import strategies
from strategies import TuneConfig
from strategies.optimizer import has_lr_scheduler


def _one_weight() -> nn.Module:
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


@pytest.mark.parametrize("choice", ["plain", "foreach", "fused"])
def test_a_step_lr_made_before_apply_sets_the_rate_the_tuned_optimizer_steps_with(choice):
    model = _one_weight()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer": choice}), model, optimizer)
    assert tuned.optimizer is optimizer and tuned.report["optimizer"]["replaced"] is False
    assert tuned.optimizer.param_groups[0]["fused"] is (choice == "fused")
    assert tuned.optimizer.param_groups[0]["foreach"] is (choice == "foreach")
    moved = []
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": the scheduler lost its optimizer.
        warnings.simplefilter("error")
        for _ in range(5):
            before = model.weight.detach().clone()
            # d(loss)/d(weight) is 1 everywhere, so Adam moves each weight by the rate it uses.
            tuned.step(tuned.model.weight.sum())
            moved.append((before - model.weight.detach()).mean().item())
            scheduler.step()
    assert moved == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025], rel=1e-5)


def test_fused_sets_what_its_constructor_would():
    model = _one_weight()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    strategies.apply(TuneConfig.from_dict({"optimizer": "fused"}), model, optimizer)
    built = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, foreach=False)
    assert optimizer.defaults == built.defaults
    assert optimizer._step_supports_amp_scaling is True


def test_fused_is_refused_where_the_constructor_refuses_it():
    model = nn.Linear(3, 1).to(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True)
    with pytest.raises(RuntimeError, match="differentiable"):
        strategies.apply(TuneConfig.from_dict({"optimizer": "fused"}), model, optimizer)
    assert optimizer.param_groups[0]["fused"] is not True  # left as it was


def test_a_scheduler_on_an_optimizer_is_detected():
    optimizer = torch.optim.AdamW(_one_weight().parameters())
    assert not has_lr_scheduler(optimizer)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    assert has_lr_scheduler(optimizer)

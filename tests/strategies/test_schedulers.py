"""An LR scheduler made before `strategies.apply` sets the rate of the optimizer that steps, in
every optimizer mode: also where `apply` replaces the user's AdamW by torchao's."""

import warnings

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import strategies
from strategies import ConfigError, TuneConfig
from strategies.schedulers import copy_hyperparameters, groups_made_from, schedulers_of

SCHEDULERS = {
    "StepLR": lambda opt: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    # cycle_momentum (the default) also moves beta1 every step
    "OneCycleLR": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=8),
    "LambdaLR": lambda opt: lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step)),
}
MODES = {
    "fp32 state": {"optimizer": "foreach"},  # tuned in place
    "bf16 state": {"optimizer_state": "bf16"},  # replaced by torchao's AdamW
    "8bit state": {"optimizer_state": "8bit"},  # replaced by torchao's AdamW8bit
}
STEPS = 6


def _moves(changes: dict | None, make_scheduler) -> tuple[list[float], object, object]:
    """Each step's move of one weight of a 64x64 matrix (4096 values: the smallest that
    torchao's AdamW8bit quantizes) under a constant gradient of 1: Adam's move is the rate it
    used, times its moments' ratio, which the schedule's betas change."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64, bias=False)
    nn.init.zeros_(model.weight)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    scheduler = make_scheduler(optimizer)
    step = lambda loss: (loss.backward(), optimizer.step(), optimizer.zero_grad())  # noqa: E731
    tuned = None
    if changes is not None:
        tuned = strategies.apply(TuneConfig.from_dict({**changes, "grad_clip": 0.0}), model,
                                 optimizer, device_type="cpu")
        step = tuned.step
    moves = []
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": the scheduler lost its optimizer.
        warnings.simplefilter("error")
        for _ in range(STEPS):
            before = model.weight.detach().clone()
            step(model.weight.sum())
            moves.append((before - model.weight.detach()).mean().item())
            scheduler.step()
    return moves, scheduler, tuned


@pytest.fixture(autouse=True)
def _eager_torchao_step(monkeypatch):
    # torchao compiles its per-parameter step (again for every new beta1 of OneCycleLR); the
    # rate it is given is the same eagerly, and the compiles would cost the suite minutes.
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_scheduler_made_before_apply_drives_the_optimizer_that_steps(mode, name):
    expected, _, _ = _moves(None, SCHEDULERS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OneCycleLR and a compiled torchao step (below)
        moves, scheduler, tuned = _moves(MODES[mode], SCHEDULERS[name])
    assert len(set(round(m, 6) for m in expected)) > 2, expected  # the schedule moves the rate
    # bf16 and 8-bit moments round: well within 5%, where a stale rate is 25% off or more.
    assert moves == pytest.approx(expected, rel=0.05), (moves, expected)
    assert scheduler.optimizer is tuned.optimizer
    replaced = mode != "fp32 state"
    assert tuned.report["optimizer"]["replaced"] is replaced
    if replaced:
        assert tuned.report["optimizer"]["schedulers_moved"] == [name]


def test_bf16_weights_step_at_the_scheduled_rate():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    config = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"})
    tuned = strategies.apply(config, model, optimizer, device_type="cpu")
    for i in range(3):
        with tuned.autocast():
            loss = tuned.model(torch.randn(4, 8)).float().pow(2).mean()
        tuned.step(loss)
        scheduler.step()
        # torchao's AdamW reads its rate from its groups, a tensor it passes to its step
        assert [float(g["lr"]) for g in tuned.optimizer.param_groups] == pytest.approx(
            [0.01 * 0.5 ** (i + 1)])


def test_a_sequential_schedule_and_a_scheduler_made_after_apply_both_follow():
    model = nn.Linear(64, 64, bias=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    warm = lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)
    decay = lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    chain = lr_scheduler.SequentialLR(optimizer, [warm, decay], milestones=[2])
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer_state": "bf16"}), model, optimizer,
                             device_type="cpu")
    assert {id(s) for s in schedulers_of(tuned.optimizer)} == {id(warm), id(decay), id(chain)}
    assert schedulers_of(optimizer) == []
    later = lr_scheduler.StepLR(tuned.optimizer, step_size=100)
    assert later.optimizer is tuned.optimizer


def test_the_replaced_optimizer_refuses_to_step():
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer_state": "bf16"}), model, optimizer,
                             device_type="cpu")
    assert tuned.optimizer is not optimizer
    with pytest.raises(ConfigError, match="replaced by strategies.apply .optimizer_state = bf16.: "
                                          "step tuned.optimizer"):
        optimizer.step()


def test_offload_copies_the_scheduled_settings_into_its_per_parameter_groups():
    """torchao's CPU offload (CUDA only) makes one group per offloaded parameter and one for the
    parameters too small to offload; the user's groups stay what a scheduler drives, and each
    step copies them over. The same structure, built here on the CPU."""
    big, small, other = (nn.Parameter(torch.zeros(n)) for n in (4096, 3, 5000))
    user = torch.optim.AdamW([{"params": [big, small], "weight_decay": 0.1},
                              {"params": [other], "weight_decay": 0.0}], lr=0.02)
    scheduler = lr_scheduler.OneCycleLR(user, max_lr=0.05, total_steps=10)
    settings = lambda g: {k: v for k, v in g.items() if k != "params"}  # noqa: E731
    per_parameter = {p: torch.optim.AdamW([{"params": [p.detach().clone()], **settings(g)}])
                     for g, p in ((user.param_groups[0], big), (user.param_groups[1], other))}
    on_device = [{"params": [small], **settings(user.param_groups[0]), "lr": torch.tensor(0.0)}]
    made = groups_made_from(user.param_groups, per_parameter, on_device)
    assert [len(m) for m in made] == [2, 1]
    for _ in range(4):
        user.step()
        scheduler.step()
        copy_hyperparameters(user.param_groups, made)
        for group, targets in zip(user.param_groups, made):
            for target in targets:
                assert float(target["lr"]) == pytest.approx(group["lr"])
                assert target["betas"] == group["betas"]
                assert target["weight_decay"] == group["weight_decay"]
    assert isinstance(on_device[0]["lr"], torch.Tensor)  # filled in place, still a tensor


def test_one_cycle_momentum_on_a_compiled_torchao_step_is_named_with_the_fix():
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=8)  # noqa: F841
    with pytest.warns(UserWarning, match="OneCycleLR cycles AdamW's beta1 .* make it with "
                                         "cycle_momentum=False"):
        strategies.apply(TuneConfig.from_dict({"optimizer_state": "8bit"}), model, optimizer,
                         device_type="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", SCHEDULERS)
def test_offloaded_state_steps_at_the_scheduled_rate_on_a_gpu(name):
    """torchao's CPU offload for real (CUDA only): the same moves as torch's AdamW."""

    def moves(changes):
        torch.manual_seed(0)
        model = nn.Linear(64, 64, bias=False).cuda()
        nn.init.zeros_(model.weight)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
        scheduler = SCHEDULERS[name](optimizer)
        tuned = strategies.apply(TuneConfig.from_dict({**changes, "grad_clip": 0.0}), model,
                                 optimizer)
        got = []
        for _ in range(STEPS):
            before = model.weight.detach().clone()
            tuned.step(model.weight.sum())
            got.append((before - model.weight.detach()).mean().item())
            scheduler.step()
        assert scheduler.optimizer is tuned.optimizer
        return got

    assert moves({"optimizer_state": "offload"}) == pytest.approx(moves({}), rel=1e-4)

"""Each strategy applied to a tiny model keeps the fp32 reference's numerics (within the
precision's tolerance) and does what its report says."""

import copy

import pytest
import torch
from torch import nn

import strategies
from strategies import ConfigError, TuneConfig
from tuner_tui.engine.trial import LOSS_TOLERANCE
from tuner_tui.engine.workloads import default_optimizer, load


def _train(config: TuneConfig, workload="gpt2-tiny", steps=3):
    w = load(workload)
    torch.manual_seed(0)
    model = w.build_model()
    tuned = strategies.apply(config, model, default_optimizer(model), device_type="cpu")
    losses = []
    for i in range(steps):
        batch = w.batch(i, 4, torch.device("cpu"))
        with tuned.autocast():
            loss = w.loss(tuned.model, batch)
        losses.append(loss.item())
        tuned.step(loss)
    return losses, tuned


@pytest.fixture(scope="module")
def reference():
    return {name: _train(TuneConfig(), name)[0] for name in ("gpt2-tiny", "llama-tiny")}


@pytest.mark.parametrize("workload", ["gpt2-tiny", "llama-tiny"])
@pytest.mark.parametrize(
    "changes",
    [
        {"precision": "bf16"},
        {"attention": "sdpa"},
        {"checkpointing": "full"},
        {"checkpointing": "every-n", "checkpoint_every": 2},
        {"checkpointing": "selective"},
        {"optimizer": "foreach"},
        {"optimizer": "fused"},
        {"grad_clip": 0.0},
    ],
)
def test_strategy_keeps_the_reference_loss(reference, workload, changes):
    config = TuneConfig.from_dict(changes)
    losses, _ = _train(config, workload)
    tol = LOSS_TOLERANCE[config.precision]
    for got, want in zip(losses, reference[workload]):
        assert abs(got - want) / want <= tol, (changes, losses, reference[workload])


def test_reports_say_what_each_strategy_did():
    _, tuned = _train(TuneConfig.from_dict(
        {"precision": "bf16", "attention": "sdpa", "checkpointing": "every-n",
         "checkpoint_every": 2, "optimizer": "foreach"}), steps=1)
    r = tuned.report
    assert r["precision"]["autocast"] == "bfloat16"
    assert r["attention"] == {"modules": 2, "impl": "sdpa"}
    assert r["checkpointing"] == {"blocks": 1, "of": 2, "policy": "every-n"}
    assert r["optimizer"]["foreach"] is True and r["optimizer"]["fused"] is False
    assert tuned.optimizer.param_groups[0]["foreach"] is True


def test_checkpointing_gives_the_same_gradients_and_keeps_parameter_names():
    w = load("gpt2-tiny")
    torch.manual_seed(0)
    plain = w.build_model()
    ckpt = copy.deepcopy(plain)
    names = [n for n, _ in ckpt.named_parameters()]
    strategies.apply(TuneConfig.from_dict({"checkpointing": "selective"}), ckpt)
    assert [n for n, _ in ckpt.named_parameters()] == names
    batch = w.batch(0, 2, torch.device("cpu"))
    w.loss(plain, batch).backward()
    w.loss(ckpt, batch).backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_optimizer_keeps_user_hyperparameters():
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9), weight_decay=0.05)
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer": "foreach"}), model, opt)
    group = tuned.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"], group["foreach"]) == (
        1e-3, (0.8, 0.9), 0.05, True)


def test_optimizer_with_state_is_refused():
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    with pytest.raises(ConfigError, match="before the first optimizer step"):
        strategies.apply(TuneConfig.from_dict({"optimizer": "fused"}), model, opt)


def test_unknown_optimizer_is_left_alone():
    model = nn.Linear(4, 4)
    opt = torch.optim.RMSprop(model.parameters())
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer": "fused"}), model, opt)
    assert tuned.optimizer is opt and tuned.report["optimizer"]["changed"] is False


def test_fp16_refused_on_cpu_model():
    with pytest.raises(ConfigError, match="fp16"):
        strategies.apply(TuneConfig.from_dict({"precision": "fp16"}), nn.Linear(2, 2))


def test_fused_kernels_without_triton_device_is_refused(monkeypatch):
    # Imported first: Triton reads TRITON_INTERPRET when the kernels are defined, and a first
    # import here would leave them compiled for a GPU for every later test of the session.
    import gputune_kernels

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    if gputune_kernels.available()[0]:
        pytest.skip("Triton kernels can run here")
    with pytest.raises(ConfigError, match="cannot run"):
        strategies.apply(TuneConfig.from_dict({"fused_kernels": ["gelu"]}), nn.GELU("tanh"))


@pytest.mark.slow
def test_compile_keeps_the_reference_loss(reference):
    config = TuneConfig.from_dict({"compile_mode": "default", "compile_scope": "block"})
    losses, tuned = _train(config, steps=2)
    assert tuned.report["compile"] == {"compiled": 2, "scope": "block", "mode": None,
                                       "fullgraph": False}
    for got, want in zip(losses, reference["gpt2-tiny"]):
        assert abs(got - want) / want <= LOSS_TOLERANCE["fp32"]


@pytest.mark.parametrize(
    "policy, swapped",
    [("inductor-first", {"layer_norm": 0, "gelu": 0, "linear_cross_entropy": 1}),
     ("all", {"layer_norm": 5, "gelu": 2, "linear_cross_entropy": 1})],
)
def test_under_compile_norms_and_activations_are_left_to_inductor_unless_asked(
        monkeypatch, policy, swapped):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import gputune_kernels

    if not gputune_kernels.available()[0]:
        pytest.skip("Triton kernels cannot run here")
    w = load("gpt2-tiny")
    model = w.build_model()
    config = TuneConfig.from_dict({
        "fused_kernels": ["layer_norm", "gelu", "linear_cross_entropy"],
        "compile_mode": "default", "kernels_with_compile": policy,
    })
    tuned = strategies.apply(config, model)  # compiling happens at the first call, not here
    assert tuned.report["fused_kernels"] == swapped
    left = tuned.report.get("fused_kernels_left_to_inductor")
    assert left == (["layer_norm", "gelu"] if policy == "inductor-first" else None)


def test_the_apply_order_is_the_registrys_and_each_module_is_named_after_its_strategy():
    from strategies.compose import APPLY_ORDER
    from strategies.registry import STRATEGIES

    assert [name for name, _ in APPLY_ORDER] == [s.name for s in STRATEGIES if s.applied]
    for name, apply_strategy in APPLY_ORDER:
        assert apply_strategy.__module__ == f"strategies.{name}"

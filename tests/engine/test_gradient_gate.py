"""The gradient gate: first-step gradients per tensor against the fp32 reference's.

The faults are injected into gputune's own fused LayerNorm kernel inside the worker process
(`WorkerSpec.fault_injection = "grad:layer_norm:..."`, engine/faults.py); the loss check is not
given any reference losses here, so only the gradient gate can catch them.
"""

import io

import pytest
import torch

from strategies.config import TuneConfig
from tuner_tui.engine import workloads
from tuner_tui.engine.gradients import (
    GRADIENT_TOLERANCE, canonical_name, collect, compare, sketch, with_wobble,
)
from tuner_tui.engine.reference_gradients import reference_gradients
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.protocol import TrialResult, WorkerSpec
from tuner_tui.engine.runner import TrialPlan, best, run_one, start_worker
from tuner_tui.engine.trial import Trainer


def test_wrapper_prefixes_are_stripped_from_parameter_names():
    assert canonical_name("_orig_mod.blocks.0.ln_1.weight") == "blocks.0.ln_1.weight"
    assert canonical_name("module._orig_mod.wte.weight") == "wte.weight"
    assert canonical_name("blocks.0._checkpoint_wrapped_module.attn.c_attn.weight") == \
        "blocks.0.attn.c_attn.weight"
    # Only a leading `module.` is DDP's; one inside the name is the model's own.
    assert canonical_name("encoder.module.weight") == "encoder.module.weight"


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)
    model(x).square().mean().backward()
    return model


def test_compare_names_the_worst_tensor_and_catches_scale_zero_and_sign():
    model = _model()
    reference = collect(model)
    assert compare(reference, model, "fp32").ok is True
    for fault, expect in ((lambda g: g * 2, "ratio 2"), (lambda g: g * 0, "cosine 0.0000"),
                          (lambda g: -g, "cosine -1.0000")):
        faulty = _model()
        faulty[1].weight.grad = fault(faulty[1].weight.grad)
        for precision in ("bf16", "fp8"):  # fp8's wider tolerance still catches each fault
            check = compare(reference, faulty, precision)
            assert check.ok is False and check.worst_tensor == "1.weight"
            assert expect in check.message and "1.weight" in check.message
    # fp8's rounding noise (the H200's worst clean tensor: cosine 0.94) passes fp8's tolerance,
    # not bf16's, on a tensor whose gradient is of the network's typical size.
    noisy = _model()
    g = noisy[0].weight.grad
    noise = torch.randn_like(g)
    noise *= 0.36 * g.norm() / noise.norm()  # cosine about 0.94
    noisy[0].weight.grad = g + noise
    assert compare(reference, noisy, "fp8").ok is True
    assert compare(reference, noisy, "bf16").ok is False
    # A compiled model's names (`_orig_mod.`) still match the reference's.
    wrapped = torch.nn.Module()
    wrapped._orig_mod = _model()
    assert compare(reference, wrapped, "fp32").ok is True
    # Nothing matched by name: unchecked, not passed.
    assert compare({"other.weight": torch.ones(2)}, model, "fp32").ok is None


def test_a_tensor_that_rounding_alone_moves_is_allowed_as_much_again():
    """A deep CNN's BatchNorm weights: their first-step gradient is a sum that nearly cancels,
    and rounding alone turns its direction (seen on the H200: torchvision's ResNet-50 in bf16,
    cosine -0.11 on a BatchNorm weight, every reduced precision refused). The reference is
    computed twice, the second time with every parameter nudged by rounding-sized noise: a
    tensor whose direction that turns is not compared by direction, and its norm may move a few
    times as far as the noise moved it; the others keep the tolerance."""
    model = _model()
    clean = sketch(collect(model))
    nudged = _model()
    nudged[1].weight.grad = -nudged[1].weight.grad  # rounding turned this one around
    reference = with_wobble(clean, sketch(collect(nudged)))
    assert reference["1.weight"].wobble == pytest.approx(2.0) and reference["0.weight"].wobble == 0
    scrambled = _model()
    scrambled[1].weight.grad = -scrambled[1].weight.grad * 5
    check = compare(reference, scrambled, "bf16")
    assert check.ok is True and check.compared == 5  # the turned tensor is left out
    broken = _model()  # but it must still be finite
    broken[1].weight.grad = broken[1].weight.grad * float("nan")
    assert compare(reference, broken, "bf16").ok is False
    still = _model()  # a tensor rounding does not move keeps its tolerance
    still[0].weight.grad = -still[0].weight.grad
    assert compare(reference, still, "bf16").ok is False


@pytest.mark.parametrize("name, config", [
    ("gpt2-tiny", {"precision": "bf16"}),
    ("llama-tiny", {"precision": "bf16", "attention": "sdpa", "checkpointing": "full"}),
    ("gpt2-tiny", {"attention": "manual"}),
])
def test_clean_configurations_pass_within_the_calibrated_tolerance(name, config):
    workload = workloads.load(name, None, 0, None, "cpu")
    reference = reference_gradients(workload, workload.default_batch_size, 0, "cpu")
    config = TuneConfig.from_dict(config)
    trainer = Trainer(workload=workload, config=config, device="cpu", seed=0,
                      reference_gradients=reference)
    trainer.build()
    trainer.step()
    trainer.finish()
    check = trainer.gradient_check
    trainer.close()
    assert check.ok is True and check.compared >= 20
    min_cos, max_dev = GRADIENT_TOLERANCE[config.precision]
    # The figures sit well inside the tolerance (calibration in gradients.py).
    assert 1 - check.min_cosine < (1 - min_cos) / 10
    assert abs(check.worst_norm_ratio - 1) < max_dev / 10


def test_reference_gradients_split_into_micro_batches_equal_the_whole_batch():
    from tuner_tui.engine.reference_gradients import _micro_batches

    workload = workloads.load("gpt2-tiny", None, 0, None, "cpu")
    whole = reference_gradients(workload, 8, 0, "cpu")
    trainer = Trainer(workload=workload, config=TuneConfig.reference(8).replace(checkpointing="full"),
                      device="cpu", seed=0)
    trainer.build()
    parts = _micro_batches(workload.batch(0, 8, trainer.torch_device), 4)
    for part in parts:
        (workload.loss(trainer.tuned.model, tuple(part)) / 4).backward()
    split = sketch(collect(trainer.tuned.model))
    trainer.close()
    assert split.keys() == whole.keys()
    for name in whole:
        assert split[name].norm == pytest.approx(whole[name].norm, rel=1e-4, abs=1e-6)
        torch.testing.assert_close(split[name].values, whole[name].values, rtol=1e-4, atol=1e-6)


def test_a_reference_attempt_that_runs_out_of_memory_is_gone_before_the_next_is_built():
    """The fallbacks (full checkpointing, then micro-batches) exist for a reference that does not
    fit; a failed attempt's model and graph must not stay alive beside the next one (on the
    H200 they held the whole GPU, and a group's rank 0 on it then ran out of memory)."""
    import dataclasses
    import gc
    import weakref

    from tuner_tui.engine.trial import warm_cpu_runtime

    workload = workloads.load("gpt2-tiny", None, 0, None, "cpu")
    warm_cpu_runtime(workload)  # (once per process: its model is not one of the attempts)
    built, alive_at_build = [], []

    def build_model():
        gc.collect()
        alive_at_build.append(sum(ref() is not None for ref in built))
        model = workload.build_model()
        built.append(weakref.ref(model))
        return model

    def loss(model, batch):
        if batch[0].shape[0] > 2:  # a batch of more than 2 rows "does not fit"
            _graph = workload.loss(model, batch)  # (held by this frame, as in a real OOM)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB.")
        return workload.loss(model, batch)

    small = dataclasses.replace(workload, build_model=build_model, loss=loss)
    small.changes_training()  # (a worker's workload found its facts on the meta device before)
    built.clear(), alive_at_build.clear()
    grads = reference_gradients(small, 8, 0, "cpu")
    # plain, full checkpointing, then 2 and 4 micro-batches: 4 rows each, then 2 rows fit.
    assert len(built) == 4 and grads is not None
    assert alive_at_build == [0, 0, 0, 0]
    gc.collect()
    assert all(ref() is None for ref in built)


FUSED_LAYER_NORM = TuneConfig.from_dict({"fused_kernels": ["layer_norm"]})


def _caught(result, tensor: str, figure: str) -> None:
    """A row the gate failed: named, its figures kept (the row ran), never the best."""
    assert result.status == "numerics" and result.grad_ok is False
    assert result.grad_worst_tensor.startswith(tensor) and result.grad_worst_tensor in result.message
    assert figure in result.message and "for fp32" in result.message
    assert result.tokens_per_s and best([result]) is None


# (the x2 fault: its worker run in test_the_loss_check_alone_misses_a_x2_gradient_*, which
# asserts this test's checks on it too)
@pytest.mark.parametrize("fault, tensor, figure", [
    (None, None, None),
    ("grad:layer_norm:zero-weight", "net.1.weight", "cosine 0.0000"),
    ("grad:layer_norm:negate-weight", "net.1.weight", "cosine -1.0000"),
])
def test_the_gate_catches_each_fault_injected_in_the_worker(fault, tensor, figure):
    spec = WorkerSpec(workload="tests.engine.user_workloads:tiny_mlp", device="cpu",
                      fault_injection=fault)
    client, _ = start_worker(spec)
    try:
        result = run_one(client, FUSED_LAYER_NORM, TrialPlan(steps=1, warmup_steps=1), (),
                         Progress(io.StringIO()))
    finally:
        client.stop()
    if fault is None:
        assert result.status == "ok" and result.grad_ok is True, result.message
        assert best([result]) is result
        return
    _caught(result, tensor, figure)


def test_a_numerics_row_is_never_recommended_or_exported_as_best():
    from tuner_tui.engine import bench
    from tuner_tui.engine.search import History, default_space
    from strategies.registry import Capabilities

    fast = TrialResult(config={"precision": "bf16"}, label="bf16", status="numerics",
                       tokens_per_s=2000.0, grad_ok=False)
    slow = TrialResult(config={}, label="fp32", status="ok", tokens_per_s=1000.0, grad_ok=True)
    assert best([fast, slow]) is slow
    plan = bench.BenchPlan(WorkerSpec(), [], remeasure_repeats=0)
    assert bench.remeasure_best(plan, [fast, slow], io.StringIO()) == (slow, None)
    history = History(default_space(Capabilities(device="cpu", cuda=False, bf16=True, triton=False), 8))
    history.add(TuneConfig.from_dict(fast.config), fast)
    history.add(TuneConfig.from_dict(slow.config), slow)
    assert history.eligible() == [slow]


def test_the_loss_check_alone_misses_a_x2_gradient_that_the_gate_catches():
    """AdamW divides a uniform scale away: the first 8 losses match, the gradients do not."""
    from tuner_tui.engine.reference import LOSS_CHECK_STEPS

    name = "tests.engine.user_workloads:tiny_mlp"
    workload = workloads.load(name, None, 0, None, "cpu")
    reference = Trainer(workload=workload, config=TuneConfig.reference(), device="cpu", seed=0)
    reference.build()
    for _ in range(LOSS_CHECK_STEPS):
        reference.step()
    reference.finish()
    losses = tuple(r.loss for r in reference.records)
    reference.close()
    client, _ = start_worker(WorkerSpec(workload=name, device="cpu",
                                        fault_injection="grad:layer_norm:x2"))
    try:
        result = run_one(client, FUSED_LAYER_NORM, TrialPlan(steps=LOSS_CHECK_STEPS - 1, warmup_steps=1),
                         losses, Progress(io.StringIO()))
    finally:
        client.stop()
    assert result.loss_ok is True and result.loss_max_rel_error < 1e-3
    assert result.status == "numerics" and result.grad_worst_norm_ratio == pytest.approx(2.0)
    _caught(result, "net.", "norm ratio 2")  # as each fault of the test above is caught


def test_fp8_configurations_are_judged_by_fp8s_tolerances():
    from strategies.config import TuneConfig
    from tuner_tui.engine.trial import LOSS_TOLERANCE, numerics

    bf16 = TuneConfig.from_dict({"precision": "bf16"})
    assert numerics(bf16) == "bf16"
    assert numerics(bf16.replace(fp8="tensorwise")) == "fp8"
    assert LOSS_TOLERANCE["fp8"] > LOSS_TOLERANCE["bf16"]


def _bottleneck_cnn(width: int = 8) -> torch.nn.Module:
    """A ResNet-50's shape in small: bottleneck blocks with BatchNorm, 3-4-6-3 of them."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid * 4, 1, bias=False), nn.BatchNorm2d(mid * 4))
            self.skip = (nn.Sequential(nn.Conv2d(cin, mid * 4, 1, stride, bias=False),
                                       nn.BatchNorm2d(mid * 4))
                         if stride != 1 or cin != mid * 4 else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU()], width
    for i, n in enumerate((3, 4, 6, 3)):
        for j in range(n):
            layers.append(Block(cin, width * 2**i, 2 if j == 0 and i else 1))
            cin = width * 2**i * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


def test_a_deep_cnn_in_bf16_passes_and_a_scaled_gradient_still_fails():
    """On a ResNet-50-shaped CNN at initialisation, bf16 autocast's first-step gradients pass
    the gate computed with the reference's wobble (without it, BatchNorm weights at cosine
    -0.4 refused every reduced precision): the tensors that rounding turns are left out; a x3
    in the classifier's backward, which rounding does not turn, still fails."""
    from tuner_tui.engine.gradients import WOBBLE_NOISE, sketch_model

    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))

    def backward(model, bf16=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        return model

    torch.manual_seed(0)
    model = backward(_bottleneck_cnn())
    clean = sketch_model(model)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.mul_(1 + WOBBLE_NOISE * torch.randn(p.shape, generator=generator))
    reference = with_wobble(clean, sketch_model(backward(model)))
    assert compare(clean, candidate := backward(_seeded_cnn(), bf16=True), "bf16").ok is False
    assert compare(reference, candidate, "bf16").ok is True
    assert reference["21.weight"].wobble < 0.05 < reference["5.body.1.weight"].wobble
    faulty = backward(_seeded_cnn())
    head = faulty[21].weight
    head.grad = head.grad * 3
    assert compare(reference, faulty, "fp32").ok is False


def _seeded_cnn():
    torch.manual_seed(0)
    return _bottleneck_cnn()

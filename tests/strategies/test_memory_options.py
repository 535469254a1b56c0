"""The memory options on tiny models: bf16 weights, optimizer state (bf16, 8-bit, offload),
float8, and micro-batches with gradient accumulation; and the rules between options.

torchao's optimizers compile their per-parameter step on the first step (seconds per
parameter shape on the CPU), so these tests use few shapes and few configurations.
"""

import pytest
import torch
from torch import nn

import strategies
from strategies import Capabilities, ConfigError, TuneConfig
from strategies.optimizer import adamw_with_state, clip_gradients, offload_optimizer_class
from tuner_tui.engine.workloads import default_optimizer, load

CPU = Capabilities(device="cpu", cuda=False, bf16=True, triton=False,
                   reasons={"cuda": "device = cpu was chosen", "fp8": "device = cpu was chosen"})


def _train(config: TuneConfig, steps: int, batch_size: int = 4):
    w = load("gpt2-tiny")
    torch.manual_seed(0)
    model = w.build_model()
    tuned = strategies.apply(config, model, default_optimizer(model), device_type="cpu")
    losses = []
    for i in range(steps):
        batch = w.batch(i % 4, batch_size, torch.device("cpu"))  # 4 batches seen again and again
        with tuned.autocast():
            loss = w.loss(tuned.model, batch)
        losses.append(loss.item())
        tuned.step(loss)
    return losses, tuned


def test_bf16_weights_train_like_fp32_master_weights():
    """Same bf16 autocast; only where the weights live differs. Tolerances: bf16 keeps 8
    significant bits, so one step's loss may differ by a few 0.1% (the trainer allows 3% for
    bf16 against fp32); over 24 steps the rounding must not accumulate into a slower descent,
    so every loss stays within 1% and the total drop (about 15% of the loss) within 5% of the
    fp32-master run's."""
    fp32, _ = _train(TuneConfig.from_dict({"precision": "bf16"}), steps=24)
    bf16, tuned = _train(TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"}), steps=24)
    assert all(p.dtype == torch.bfloat16 for p in tuned.model.parameters())
    assert tuned.report["weights"] == {"dtype": "bf16", "parameters_cast": 28,
                                       "kept_beside_running_statistics": 0}
    report = tuned.report["optimizer"]
    assert report["type"] == "torchao AdamW" and report["stochastic_rounding"] is True
    state = next(iter(tuned.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.float32  # optimizer_state = fp32 (the default)
    for got, want in zip(bf16, fp32):
        assert abs(got - want) / want <= 0.01, (bf16, fp32)
    drop_fp32, drop_bf16 = fp32[0] - fp32[-1], bf16[0] - bf16[-1]
    assert drop_fp32 > 0.1 * fp32[0]
    assert abs(drop_bf16 - drop_fp32) <= 0.05 * drop_fp32, (bf16, fp32)


def test_bf16_weights_keep_batch_norm_in_fp32_beside_its_statistics():
    """A ResNet's BatchNorm takes its weights and running statistics in one dtype (cast with the
    rest, ResNet-50 crashed on the H200: "Expected running_mean to have type BFloat16"). Its
    parameters stay fp32 beside the fp32 statistics, the convolutions go bf16, and it trains
    like the fp32-master run (each of 8 losses within 2%)."""
    from examples.vision_cnn import SmallResNet

    def train(config):
        torch.manual_seed(0)
        model = SmallResNet(channels=8, depth=1)
        tuned = strategies.apply(config, model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                 device_type="cpu")
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 3, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        losses = []
        for _ in range(8):
            with tuned.autocast():
                loss = nn.functional.cross_entropy(tuned.model(x).float(), y)
            losses.append(loss.item())
            tuned.step(loss)
        return losses, tuned

    master, _ = train(TuneConfig.from_dict({"precision": "bf16"}))
    losses, tuned = train(TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"}))
    norms = [m for m in tuned.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(p.dtype == torch.float32 for m in norms for p in m.parameters())
    assert all(m.running_var.dtype == torch.float32 for m in norms)
    assert tuned.model.stem[0].weight.dtype == torch.bfloat16
    assert tuned.report["weights"]["kept_beside_running_statistics"] == 2 * len(norms)
    for got, want in zip(losses, master):
        assert abs(got - want) / want <= 0.02, (losses, master)


def test_stochastic_rounding_keeps_updates_smaller_than_a_bf16_step():
    """Weights at 1.0 (bf16 spacing 2^-7 there) and AdamW steps of lr = 1e-3, under half that
    spacing: round-to-nearest loses every update; stochastic rounding (what weights = bf16
    uses) moves the weights by the right amount on average, so the loss falls as in fp32
    (within 10%: each weight's walk has a spread of about 15% of its 0.3 move, averaged over
    64 weights)."""
    torch.manual_seed(0)
    x = torch.randn(256, 64)
    y = x @ torch.full((64,), 0.5)

    def losses(dtype, optimizer_for):
        model = nn.Linear(64, 1, bias=False)
        nn.init.ones_(model.weight)
        model.weight.data = model.weight.data.to(dtype)
        opt = optimizer_for(model)
        seen = []
        for _ in range(301):
            loss = ((model(x.to(dtype)).squeeze(1).float() - y) ** 2).mean()
            seen.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
        return seen[0], seen[-1]

    def ours(m):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0)
        return strategies.apply(
            TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"}), m, opt).optimizer

    fp32 = losses(torch.float32, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3,
                                                             weight_decay=0.0))
    stochastic = losses(torch.bfloat16, ours)
    nearest = losses(torch.bfloat16, lambda m: adamw_with_state(torch.float32)(
        m.parameters(), lr=1e-3, weight_decay=0.0, bf16_stochastic_round=False))
    assert nearest[1] == nearest[0]  # round-to-nearest: no weight ever moved
    assert stochastic[0] - stochastic[1] == pytest.approx(fp32[0] - fp32[1], rel=0.10)


class TwoLayers(nn.Module):
    """64x64 = 4096 values: the smallest tensor torchao's AdamW8bit quantizes."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(64, 64)
        self.out = nn.Linear(64, 8)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def _fit_two_layers(config: TuneConfig, steps: int = 30):
    torch.manual_seed(0)
    model = TwoLayers()
    groups = [{"params": [model.hidden.weight, model.out.weight], "weight_decay": 0.1},
              {"params": [model.hidden.bias, model.out.bias], "weight_decay": 0.0, "name": "bias"}]
    opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.85, 0.97), eps=1e-7)
    tuned = strategies.apply(config, model, opt, device_type="cpu")
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    losses = []
    for _ in range(steps):
        with tuned.autocast():
            loss = nn.functional.mse_loss(tuned.model(x).float(), y)
        losses.append(loss.item())
        tuned.step(loss)
    return losses, tuned


@pytest.mark.parametrize("changes, state_dtype", [
    ({"optimizer_state": "bf16"}, torch.bfloat16),
    ({"optimizer_state": "8bit", "weights": "bf16", "precision": "bf16"}, torch.uint8),
])
def test_optimizer_state_trains_and_keeps_groups_and_hyperparameters(changes, state_dtype):
    reference, _ = _fit_two_layers(TuneConfig())
    losses, tuned = _fit_two_layers(TuneConfig.from_dict(changes))
    groups = tuned.optimizer.param_groups
    assert [len(g["params"]) for g in groups] == [2, 2] and groups[1]["name"] == "bias"
    for group, decay in zip(groups, (0.1, 0.0)):
        assert float(group["lr"]) == pytest.approx(3e-3)
        assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.85, 0.97), 1e-7, decay)
    exp_avg = tuned.optimizer.state[tuned.model.hidden.weight]["exp_avg"]
    stored = exp_avg.codes.dtype if state_dtype == torch.uint8 else exp_avg.dtype
    assert stored == state_dtype
    assert tuned.report["optimizer"]["state"] == changes["optimizer_state"]
    # Low-precision state fits as well as fp32 state: the loss falls by most of as much.
    assert losses[-1] < 0.5 * losses[0]
    assert losses[0] - losses[-1] >= 0.9 * (reference[0] - reference[-1]), (losses, reference)


def test_torch_adamw_implementation_applies_only_where_torch_steps():
    _, tuned = _fit_two_layers(TuneConfig.from_dict({"optimizer": "fused"}), steps=1)
    assert tuned.report["optimizer"]["implementation_applied"] is True
    assert tuned.optimizer.param_groups[0]["fused"] is True
    model = TwoLayers()
    tuned = strategies.apply(TuneConfig.from_dict({"optimizer": "fused", "optimizer_state": "bf16"}),
                             model, torch.optim.AdamW(model.parameters()))
    assert tuned.report["optimizer"]["implementation_applied"] is False
    assert "fused" not in tuned.optimizer.param_groups[0]


def test_low_precision_state_needs_adamw():
    model = TwoLayers()
    with pytest.raises(ConfigError, match="optimizer_state = 8bit.*SGD"):
        strategies.apply(TuneConfig.from_dict({"optimizer_state": "8bit"}), model,
                         torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("changes, both", [
    ({"weights": "bf16"}, ("weights = bf16", "precision = fp32")),
    ({"weights": "bf16", "precision": "fp16"}, ("weights = bf16", "precision = fp16")),
    ({"batch_size": 8, "micro_batch_size": 3}, ("micro_batch_size = 3", "batch_size = 8")),
    ({"optimizer_state": "offload", "precision": "fp16"},
     ("optimizer_state = offload", "precision = fp16")),
])
def test_bad_combinations_name_both_options(changes, both):
    with pytest.raises(ConfigError) as err:
        TuneConfig.from_dict(changes)
    message = str(err.value)
    assert all(part in message for part in both), message
    assert "\n" not in message


@pytest.mark.parametrize("changes, needs", [
    ({"fp8": "tensorwise"}, "compute capability 8.9"),
    ({"optimizer_state": "offload"}, "a CUDA GPU"),
])
def test_gpu_only_choices_are_refused_on_the_cpu_with_one_line(changes, needs):
    with pytest.raises(ConfigError) as err:
        TuneConfig.from_dict(changes).check_runnable(CPU)
    message = str(err.value)
    key, value = next(iter(changes.items()))
    assert message.startswith(f"{key} = {value} needs") and needs in message, message
    assert "device = cpu" in message and "\n" not in message


@pytest.mark.parametrize("changes", [{"fp8": "rowwise"}, {"optimizer_state": "offload"}])
def test_gpu_only_strategies_refuse_a_cpu_model(changes):
    key, value = next(iter(changes.items()))
    model = TwoLayers()
    with pytest.raises(ConfigError, match=f"{key} = {value} needs a CUDA GPU"):
        strategies.apply(TuneConfig.from_dict(changes), model,
                         torch.optim.AdamW(model.parameters()), device_type="cpu")


def test_float8_leaves_out_the_lm_head_and_odd_shapes():
    from strategies.float8 import float8_filter
    from examples.hf_causal_lm import gpt2

    model = gpt2("cpu").build_model()
    keep = float8_filter(model)
    assert not keep(model.lm_head, "lm_head")  # tied to the token embedding
    assert not keep(nn.Linear(64, 24), "")  # 24 is not a multiple of 16
    assert keep(nn.Linear(64, 32), "")
    assert keep(TwoLayers().hidden, "hidden") and not keep(TwoLayers().out, "out")


@pytest.mark.parametrize("recipe, kept", [
    ("tensorwise", {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("rowwise", {"gate_proj", "up_proj"}),
])
def test_float8_auto_leaves_out_the_linears_too_small_to_pay(recipe, kept):
    """A Llama 1B's block (hidden 2048, 8 of 32 heads for k and v, MLP 8192), on the meta
    device: with fp8_layers = auto, torchao's thresholds for the recipe decide; with all, every
    linear whose dims are multiples of 16 is converted."""
    from strategies.float8 import float8_filter

    shapes = {"q_proj": (2048, 2048), "k_proj": (2048, 512), "v_proj": (2048, 512),
              "o_proj": (2048, 2048), "gate_proj": (2048, 8192), "up_proj": (2048, 8192),
              "down_proj": (8192, 2048)}
    block = nn.ModuleDict({k: nn.Linear(*v, bias=False, device="meta") for k, v in shapes.items()})
    auto = float8_filter(block, recipe, "auto")
    every = float8_filter(block, recipe, "all")
    assert {k for k, m in block.items() if auto(m, k)} == kept
    assert all(every(m, k) for k, m in block.items())


def test_labels_show_the_new_options():
    config = TuneConfig.from_dict({
        "precision": "bf16", "weights": "bf16", "fp8": "rowwise", "optimizer_state": "8bit",
        "batch_size": 16, "micro_batch_size": 4,
    })
    assert config.label() == "bf16 + bf16 weights + fp8 rowwise + 8bit state + batch 16 + micro 4"
    assert TuneConfig().label() == "fp32"


# -- micro-batches -------------------------------------------------------------------------------


def _grads_after(config: TuneConfig, batch_size: int = 8):
    w = load("gpt2-tiny")
    torch.manual_seed(0)
    model = w.build_model()
    tuned = strategies.apply(config, model, default_optimizer(model), device_type="cpu")
    batch = w.batch(0, batch_size, torch.device("cpu"))
    parts = tuned.micro_batches(batch)
    for micro in parts:
        tuned.backward(w.loss(tuned.model, micro))
    return len(parts), {n: p.grad.clone() for n, p in tuned.model.named_parameters()}


@pytest.mark.parametrize("micro, parts", [(4, 2), (1, 8)])
def test_accumulated_micro_batches_give_the_whole_batch_gradients(micro, parts):
    _, whole = _grads_after(TuneConfig())
    count, accumulated = _grads_after(TuneConfig.from_dict({"micro_batch_size": micro}))
    assert count == parts
    for name, grad in whole.items():
        # fp32: only the order of the sums differs.
        torch.testing.assert_close(accumulated[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_micro_batches_split_every_tensor_of_the_batch_and_check_the_size():
    model = TwoLayers()
    tuned = strategies.apply(TuneConfig.from_dict({"micro_batch_size": 2}), model)
    x, y, mask = torch.randn(6, 64), torch.randn(6, 8), torch.ones(3, 3)
    parts = tuned.micro_batches({"x": x, "pair": (y, mask), "note": "kept"})
    assert len(parts) == 3 and tuned.accumulation_steps == 3
    assert torch.equal(parts[1]["x"], x[2:4]) and torch.equal(parts[2]["pair"][0], y[4:6])
    assert parts[0]["pair"][1] is mask and parts[0]["note"] == "kept"  # not batch-sized
    with pytest.raises(ConfigError, match="micro_batch_size = 2 does not divide batch_size = 5"):
        tuned.micro_batches((torch.randn(5, 64),))


def test_whole_batch_is_one_micro_batch():
    tuned = strategies.apply(TuneConfig(), TwoLayers())
    x = torch.randn(5, 64)
    (part,) = tuned.micro_batches(x)
    assert part is x and tuned.accumulation_steps == 1


@pytest.mark.gpu
def test_micro_batches_under_cuda_graphs_give_the_whole_batch_gradients_step_after_step():
    # CUDA graphs hand the first micro-batch's gradients out in the graph's own buffers, which
    # the next replay overwrites: torch 2.11 stopped such a run on the H200 until `backward`
    # made them its own.
    w = load("llama-tiny")
    cuda = torch.device("cuda")

    def grads(config, steps=2):
        torch.manual_seed(0)
        with cuda:
            model = w.build_model()
        tuned = strategies.apply(config, model, default_optimizer(model), device_type="cuda")
        found = []
        for _ in range(steps):
            for micro in tuned.micro_batches(w.batch(0, 8, cuda)):
                torch.compiler.cudagraph_mark_step_begin()
                tuned.backward(w.loss(tuned.model, micro))
            found.append({n: p.grad.clone() for n, p in tuned.model.named_parameters()})
            tuned.zero_grad()
        return found

    whole = grads(TuneConfig(), steps=1)[0]
    graphed = grads(TuneConfig.from_dict({"compile_mode": "reduce-overhead", "micro_batch_size": 2}))
    for step in graphed:
        for name, grad in whole.items():
            torch.testing.assert_close(step[name], grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_trains_on_the_gpu(recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    # every linear: llama-tiny's are all below the size where fp8_layers=auto converts one
    config = TuneConfig.from_dict({"precision": "bf16", "fp8": recipe, "fp8_layers": "all"})
    w = load("llama-tiny")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = w.build_model()
    tuned = strategies.apply(config, model, default_optimizer(model), device_type="cuda")
    assert tuned.report["float8"]["linears"] > 0
    first = last = None
    for i in range(10):
        batch = w.batch(i % 2, 8, torch.device("cuda"))
        with tuned.autocast():
            loss = w.loss(tuned.model, batch)
        first = first if first is not None else loss.item()
        last = loss.item()
        tuned.step(loss)
    assert last < first


def test_clipping_scales_the_cpu_copies_of_the_offload_optimizer_that_apply_builds():
    """torchao's CPU offload copies each gradient to the CPU during backward, before the global
    norm is known, and `clip_gradients` scales those copies too. It must know the class `build`
    makes (a subclass of torchao's): checked by the class's name alone, it left them unclipped,
    and an offloaded trial on an H100 trained 28% off the fp32 reference (2026-12-07). The
    CUDA-only parts (the copy's event) stand in on the CPU; the GPU test below runs them."""
    from types import SimpleNamespace

    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.full((4,), 3.0)
    copy = torch.zeros(4, requires_grad=True)
    copy.grad = p.grad.clone()
    optimizer = object.__new__(offload_optimizer_class())  # (its __init__ needs CUDA)
    optimizer.queue = {p: SimpleNamespace(synchronize=lambda: None)}
    optimizer.param_d2h_map = {p: copy}
    clip_gradients(optimizer, [p], max_norm=1.0)
    assert float(p.grad.norm()) == pytest.approx(1.0, rel=1e-4)
    assert torch.allclose(copy.grad, p.grad)


@pytest.mark.gpu
def test_offloaded_state_trains_and_clips_on_the_gpu():
    from tuner_tui.engine.memory_parts import memory_parts

    w = load("gpt2-tiny")
    results = {}
    for state in ("fp32", "offload"):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = w.build_model()
        config = TuneConfig.from_dict({"optimizer_state": state, "grad_clip": 0.1})
        tuned = strategies.apply(config, model, default_optimizer(model), device_type="cuda")
        losses = []
        for i in range(5):
            batch = w.batch(i % 2, 4, torch.device("cuda"))
            loss = w.loss(tuned.model, batch)
            losses.append(loss.item())
            tuned.step(loss, zero_grad=False)
            parts = memory_parts(tuned.model, tuned.optimizer, torch.device("cuda"))
            tuned.zero_grad()
        results[state] = (losses, parts)
    # Clipped the same way whether the state is on the GPU or on the CPU.
    for got, want in zip(results["offload"][0], results["fp32"][0]):
        assert got == pytest.approx(want, rel=1e-4)
    assert results["offload"][1]["optimizer_state"] < 0.1 * results["fp32"][1]["optimizer_state"]


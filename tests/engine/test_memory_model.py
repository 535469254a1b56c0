"""The memory model and how the search meets a memory budget: pure parts, no workers (the
anytime strategy against a pretend device)."""

from __future__ import annotations

import dataclasses

import pytest

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine.noise import simplest
from tuner_tui.engine.protocol import TrialResult
from tuner_tui import format as fmt
from tuner_tui.engine.search import (
    AnytimeSearch, History, SearchOutcome, default_space, explain, report,
)
from tuner_tui.engine.search.driver import check_devices
from tuner_tui.engine.search.report import tied_leaders
from tuner_tui.engine.search.memory import (
    SKIP_MARGIN, data_parallel_bytes, estimate, fixed_bytes, holds_at_least, micro_batch,
    parameter_count, prior_estimate, static_parts, trainable_count,
)
from tuner_tui.engine.search.memory_prior import ModelShape, autocast_copy_bytes, per_sample_bytes

CPU = Capabilities(device="cpu", cuda=False, bf16=True, triton=False)
GPU = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="NVIDIA H200")
MiB = 2**20
N = 10_000_000  # parameters of the pretend model


def _row(config: TuneConfig, peak: int | None, tokens_per_s: float | None = 1.0,
         status: str = "ok", parts: bool = True) -> TrialResult:
    p, g, s = static_parts(config, N)
    return TrialResult(config=config.to_dict(), label=config.label(), status=status,
                       tokens_per_s=tokens_per_s if status == "ok" else None,
                       peak_memory_bytes=peak, loss_ok=True if status == "ok" else None,
                       memory_parts={"parameters": p, "gradients": g, "optimizer_state": s}
                       if parts else {})


def test_static_parts_follow_the_dtypes_of_weights_and_optimizer_state():
    fp32 = TuneConfig.from_dict({})
    assert static_parts(fp32, N) == (4 * N, 4 * N, 8 * N)
    lean = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "optimizer_state": "8bit"})
    assert static_parts(lean, N) == (2 * N, 2 * N, 2 * N)
    assert static_parts(fp32.replace(optimizer_state="offload"), N)[2] == 0
    assert parameter_count([_row(lean, 100 * MiB)]) == N


def test_a_frozen_backbone_is_estimated_with_the_gradients_and_state_of_its_trainable_part():
    # (counted whole, a frozen backbone's state put a CPU model's estimates at 362 MiB where
    # 161 MiB was measured, and its search fitted the budget with 8-bit state and micro-batches)
    trainable = N // 100
    fp32 = TuneConfig.from_dict({"batch_size": 8})
    p, g, s = static_parts(fp32, N, trainable)
    assert (p, g, s) == (4 * N, 4 * trainable, 8 * trainable)
    measured = TrialResult(config=fp32.to_dict(), label=fp32.label(), status="ok",
                           tokens_per_s=1.0, peak_memory_bytes=p + g + s + 80 * MiB, loss_ok=True,
                           memory_parts={"parameters": p, "trainable": 4 * trainable,
                                         "gradients": g, "optimizer_state": s})
    assert trainable_count([measured]) == trainable and trainable_count([_row(fp32, 1)]) is None
    lean = fp32.replace(optimizer_state="8bit")
    found = estimate(lean, [measured], default_batch=8)
    assert found.optimizer_state == 2 * trainable and found.activations == 80 * MiB
    assert found.total == 4 * N + 4 * trainable + 2 * trainable + 80 * MiB
    # A row measured before trainable parameters were counted: all of them train.
    assert estimate(lean, [_row(fp32, sum(static_parts(fp32, N)) + 80 * MiB)], 8).optimizer_state \
        == 2 * N


def test_the_estimate_computes_the_static_parts_and_scales_activations_by_the_micro_batch():
    bf16 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 8})
    measured = [_row(bf16, sum(static_parts(bf16, N)) + 80 * MiB)]  # 10 MiB a sample
    lean = bf16.replace(weights="bf16", optimizer_state="8bit", micro_batch_size=2)
    found = estimate(lean, measured, default_batch=8)
    assert (found.parameters, found.gradients, found.optimizer_state) == (2 * N, 2 * N, 2 * N)
    assert found.activations == 20 * MiB  # two samples at a time
    assert found.total == 6 * N + 20 * MiB
    assert found.basis == bf16.label()
    # A measured checkpointing ratio applies to the activations, not to the whole peak.
    full = bf16.replace(checkpointing="full")
    measured.append(_row(full, sum(static_parts(full, N)) + 20 * MiB))
    found = estimate(lean.replace(checkpointing="full"), measured, 8)
    assert found.activations == 5 * MiB
    assert estimate(lean, [], 8) is None


def test_an_fp32_configuration_is_estimated_from_a_bf16_weights_trial():
    # The walk from the measured trial moves one option at a time; precision fp32 cannot move
    # while the weights are still bf16 (the rules refuse it), so it waits for them. It raised
    # ConfigError before: `gputune bench` of a bf16-weights configuration then an fp32 one died.
    lean = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "batch_size": 8})
    measured = [_row(lean, sum(static_parts(lean, N)) + 80 * MiB)]
    fp32 = TuneConfig.from_dict({"batch_size": 8})
    found = estimate(fp32, measured, default_batch=8)
    assert found is not None and found.parameters == 4 * N and not found.certain
    assert found.activations >= 80 * MiB  # fp32 holds no less a sample than bf16


def test_a_compiled_configuration_is_estimated_from_the_nearest_trial_compiled_alike():
    # Two trials as near (two options apart each): the one with the same compile mode is the
    # basis, as CUDA graphs keep a pool of their own (on the H200, a 1.5B Llama's CUDA-graph
    # configuration was estimated from the eager trial at 13.6 GiB and peaked at 16.0).
    eager = TuneConfig.from_dict({"precision": "bf16", "fused_kernels": ["rms_norm"],
                                  "batch_size": 8})
    graphs = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "reduce-overhead",
                                   "checkpointing": "full", "attention": "sdpa",
                                   "batch_size": 8})
    measured = [_row(eager, sum(static_parts(eager, N)) + 40 * MiB),
                _row(graphs, sum(static_parts(graphs, N)) + 70 * MiB)]
    wanted = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "reduce-overhead",
                                   "batch_size": 8})
    assert estimate(wanted, measured, default_batch=8).basis == graphs.label()
    assert estimate(wanted.replace(compile_mode="off", attention="sdpa"), measured, 8).basis \
        == eager.label()


def test_the_first_trial_is_estimated_from_its_parameters_and_shapes_alone():
    shape = ModelShape(layers=2, hidden=64, intermediate=176, heads=4, kv_heads=2, vocab=512,
                       seq_len=64)
    bf16 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 8, "micro_batch_size": 2})
    first = dataclasses.replace(_row(bf16, 10**12), model_shape=shape.to_dict())  # a peak it must not use
    found = prior_estimate(bf16, first, default_batch=8)
    assert (found.parameters, found.gradients, found.optimizer_state) == static_parts(bf16, N)
    assert found.activations == int(2 * per_sample_bytes(bf16, shape) + autocast_copy_bytes(bf16, N))
    assert not found.certain and found.basis == "the model's shapes"
    # the estimate is the same whatever the trial measured
    assert prior_estimate(bf16, dataclasses.replace(first, peak_memory_bytes=1), 8) == found
    # without the worker's counts (a build that failed) there is none
    assert prior_estimate(bf16, _row(bf16, None, status="error", parts=False), 8) is None


def test_without_measured_parts_the_whole_peak_scales_as_before():
    bf16 = TuneConfig.from_dict({"precision": "bf16"})
    measured = [_row(bf16, 800 * MiB, parts=False)]
    assert estimate(bf16.replace(batch_size=32), measured, 8).total == 3200 * MiB


def test_an_estimate_never_falls_below_a_measured_trial_it_holds_at_least_as_much_as():
    # llama-1b on an H100 (search-llama16-958a84a): float8 and checkpointing off was estimated
    # 17.6 GiB from a selective trial without float8 (the saving measured under selective does
    # not carry to none) and held 21.3, where the same with float8 had held 18.9.
    lean = {"precision": "bf16", "weights": "bf16", "attention": "sdpa", "batch_size": 8,
            "compile_mode": "reduce-overhead", "compile_scope": "block"}
    selective = TuneConfig.from_dict({**lean, "checkpointing": "selective"})
    selective_fp8 = selective.replace(fp8="tensorwise")
    unchecked_fp8 = selective_fp8.replace(checkpointing="off")
    fixed = sum(static_parts(selective, N))
    # (as near as each other, the selective trial is the basis: checkpointing taken off scales
    # its activations by no measured ratio)
    measured = [_row(selective, fixed + 40 * MiB), _row(unchecked_fp8, fixed + 120 * MiB)]
    unchecked = unchecked_fp8.replace(fp8="off")
    assert holds_at_least(unchecked, unchecked_fp8, 8)
    found = estimate(unchecked, measured, default_batch=8)
    assert found.total == fixed + 120 * MiB and found.certain
    assert found.basis == f"{selective.label()}; at least {unchecked_fp8.label()}"
    assert estimate(unchecked, measured[:1], default_batch=8).total < fixed + 120 * MiB
    # Eager, torchao's float8 holds more than bf16 alone: no order, the estimate as it was.
    eager = [_row(c.replace(compile_mode="off"), measured_peak_of)
             for c, measured_peak_of in ((selective, fixed + 40 * MiB),
                                         (unchecked_fp8, fixed + 120 * MiB))]
    eager_unchecked = unchecked.replace(compile_mode="off")
    assert not holds_at_least(eager_unchecked, unchecked_fp8.replace(compile_mode="off"), 8)
    assert estimate(eager_unchecked, eager, default_batch=8).total < fixed + 120 * MiB
    # A smaller micro-batch, fewer bytes of state, or another attention: no bound.
    assert not holds_at_least(unchecked.replace(micro_batch_size=4), unchecked_fp8, 8)
    assert holds_at_least(unchecked_fp8.replace(optimizer_state="fp32"),
                          unchecked_fp8.replace(optimizer_state="8bit"), 8)
    assert not holds_at_least(unchecked_fp8.replace(optimizer_state="8bit"), unchecked_fp8, 8)
    assert not holds_at_least(unchecked.replace(attention="manual"), unchecked_fp8, 8)


def test_the_space_halves_the_micro_batch_down_to_one_and_canonicalises():
    space = default_space(CPU, default_batch=8)
    config = space.start()
    assert space.micro_batches(config) == [0, 4, 2, 1]
    assert space.canonical(config.replace(micro_batch_size=8)).micro_batch_size == 0
    # torch's AdamW implementation flags do nothing where torchao's AdamW steps
    lean = config.replace(optimizer_state="8bit", optimizer="foreach")
    assert space.canonical(lean).optimizer == "plain"
    assert default_space(CPU, 6).micro_batches(config.replace(batch_size=6)) == [0, 3, 1]


def _simulate(space, budget, peak_of, speed_of, limit=60, device="cpu"):
    """Run the anytime strategy (no time budget: until no move is expected to pay) against a
    pretend device whose peaks and speeds `peak_of` and `speed_of` give."""
    from tuner_tui.engine.search.priors import Context

    strategy = AnytimeSearch(space, Context(device, False, space.default_batch),
                             budget_bytes=budget)
    history = History(space, budget_bytes=budget)
    tried = []
    for _ in range(limit):
        proposal = strategy.next(history)
        if proposal is None:
            break
        c = proposal.config
        tried.append(c)
        result = _row(c, peak_of(c), speed_of(c))
        history.add(c, result)
        strategy.observe(c, result, 1.0, history)
    return strategy, history, tried


def test_a_budget_only_full_checkpointing_at_micro_batch_one_meets_is_met_by_it():
    fixed = {"attention": "sdpa", "compile_mode": "off", "optimizer": "plain",
             "weights": "bf16", "precision": "bf16", "optimizer_state": "8bit"}
    space = default_space(CPU, 8, fixed=fixed)
    per_sample = {"off": 40 * MiB, "selective": 30 * MiB, "every-n": 25 * MiB, "full": 10 * MiB}

    def peak(c):
        micro = c.micro_batch_size or 8
        return sum(static_parts(c, N)) + per_sample[c.checkpointing] * micro

    def speed(c):
        return 100 - 10 * ("off", "selective", "every-n", "full").index(c.checkpointing) \
            - 5 * (8 // (c.micro_batch_size or 8))

    budget = 6 * N + 12 * MiB  # only full checkpointing with one sample at a time fits
    strategy, history, tried = _simulate(space, budget, peak, speed)
    best = history.best()
    assert best is not None, "a configuration of the space fits: the search must find it"
    assert (best.config["checkpointing"], best.config["micro_batch_size"]) == ("full", 1)
    assert max(r.peak_memory_bytes for r in history.eligible()) <= budget


def _lever_model():
    """A pretend device: checkpointing saves activations and costs speed, bf16 halves the
    activations and doubles the speed, 8-bit state and micro-batches cost speed."""
    act = {"off": 40 * MiB, "selective": 30 * MiB, "every-n": 25 * MiB, "full": 10 * MiB}

    def peak(c):
        micro = c.micro_batch_size or 8
        scale = 1.0 if c.precision == "fp32" else 0.6
        return sum(static_parts(c, N)) + int(act[c.checkpointing] * micro * scale)

    def speed(c):
        return (200 if c.precision == "bf16" else 100) * (1 - 0.1 * (
            ("off", "selective", "every-n", "full").index(c.checkpointing))) / (
            1 + 0.2 * (8 // (c.micro_batch_size or 8) - 1)) * (
            0.85 if c.optimizer_state == "8bit" else 1.0)

    return peak, speed


def test_when_the_baseline_does_not_fit_the_expert_recipe_is_made_to_fit_and_climbs():
    space = default_space(GPU, 8, fixed={"attention": "sdpa", "compile_mode": "off",
                                         "optimizer": "plain", "fused_kernels": ()})
    peak, speed = _lever_model()
    budget = 6 * N + 8 * 18 * MiB  # bf16 weights, 8-bit state and some checkpointing
    strategy, history, tried = _simulate(space, budget, peak, speed, device="cuda")
    baseline = history.get(space.start())
    assert baseline.peak_memory_bytes > budget
    # Right after the baseline, the expert's recipe, fitted by the memory model from the
    # baseline's measured peak: bf16, with memory levers until the estimate fits.
    expert = tried[1]
    assert expert.precision == "bf16" and expert == strategy.opening.expert
    assert peak(expert) <= budget
    best = history.best()
    assert best is not None and best.peak_memory_bytes <= budget
    floor = expert.replace(checkpointing="full", micro_batch_size=1, optimizer_state="8bit",
                           weights="bf16")
    assert best.tokens_per_s > speed(floor) and floor not in tried


def test_where_a_cheap_lever_fits_the_search_never_falls_to_the_slow_ones():
    space = default_space(CPU, 8, fixed={"attention": "sdpa", "compile_mode": "off",
                                         "optimizer": "plain"})
    peak, speed = _lever_model()
    selective = TuneConfig.from_dict({"attention": "sdpa", "precision": "bf16",
                                      "weights": "bf16", "optimizer_state": "bf16",
                                      "checkpointing": "selective"})
    budget = peak(selective)  # bf16 state with selective checkpointing just fits
    strategy, history, tried = _simulate(space, budget, peak, speed)
    best = history.best()
    assert best.peak_memory_bytes <= budget and best.config["optimizer_state"] != "8bit"
    assert best.tokens_per_s >= speed(selective)
    assert not any(c.checkpointing == "full" and c.micro_batch_size == 1 for c in tried)


@pytest.mark.parametrize("over", [1.10, 1.20])
def test_an_estimate_skips_only_what_is_clearly_over_the_budget(over):
    bf16 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 8})
    static = sum(static_parts(bf16, N))
    measured = [_row(bf16, static + 80 * MiB)]
    budget = int((static + 80 * MiB) / over)
    guess = estimate(bf16.replace(micro_batch_size=8), measured, 8)
    assert (guess.total > budget * SKIP_MARGIN) is (over > SKIP_MARGIN)


# -- several devices: DDP against FSDP2 under a per-GPU budget -----------------------------------


def test_fsdp2_divides_parameters_gradients_and_state_by_the_devices_and_ddp_adds_buckets():
    ddp = TuneConfig.from_dict({"parallel": "ddp", "devices": 2, "batch_size": 8})
    assert static_parts(ddp, N) == (4 * N, 4 * N, 8 * N)  # every rank holds it all
    assert data_parallel_bytes(ddp, N) == 4 * N  # the all-reduce buckets: the gradients again
    assert data_parallel_bytes(ddp.replace(ddp_bucket_view=True), N) == 0
    fsdp2 = ddp.replace(parallel="fsdp2")
    assert static_parts(fsdp2, N) == (2 * N, 2 * N, 4 * N)
    assert static_parts(fsdp2.replace(devices=4, batch_size=16), N) == (N, N, 2 * N)
    assert data_parallel_bytes(fsdp2, N) == 0
    # Without resharding, every block's gathered parameters stay from forward to backward, in
    # the dtype FSDP2 gathers: the autocast dtype, else the weights'.
    assert data_parallel_bytes(fsdp2.replace(fsdp_reshard=False), N) == 4 * N
    assert data_parallel_bytes(fsdp2.replace(fsdp_reshard=False, precision="bf16"), N) == 2 * N
    # Activations scale with each rank's own samples; the parameter count is read back whole
    # from one rank's shard.
    assert micro_batch(fsdp2, default_batch=8) == 4
    assert micro_batch(fsdp2.replace(micro_batch_size=2), 8) == 2
    assert parameter_count([_row(fsdp2, 100 * MiB)]) == N


def test_the_estimate_of_fsdp2_from_a_measured_ddp_run_shards_only_the_static_parts():
    ddp = TuneConfig.from_dict({"parallel": "ddp", "devices": 2, "batch_size": 8})
    measured = [_row(ddp, fixed_bytes(ddp, N) + 4 * 10 * MiB)]  # 10 MiB for each of 4 samples
    found = estimate(ddp.replace(parallel="fsdp2"), measured, default_batch=8)
    assert (found.parameters, found.gradients, found.optimizer_state) == (2 * N, 2 * N, 4 * N)
    assert found.activations == 40 * MiB and found.data_parallel == 0 and found.certain
    assert found.total == 8 * N + 40 * MiB
    # From one process's run of the whole batch: each rank holds half its activations.
    one = TuneConfig.from_dict({"batch_size": 8})
    found = estimate(ddp, [_row(one, fixed_bytes(one, N) + 8 * 10 * MiB)], 8)
    assert found.activations == 40 * MiB and found.data_parallel == 4 * N
    assert found.to_dict()["total"] == found.total == 20 * N + 40 * MiB


GROUP = {"devices": 2, "attention": "sdpa", "compile_mode": "off", "optimizer": "plain",
         "checkpointing": "off", "micro_batch_size": 0, "fused_kernels": (), "fp8": "off"}


def _group_device(speeds: dict):
    """A pretend pair of GPUs: what each rank holds by the same rules as torch (FSDP2 shards the
    static parts, DDP holds them whole plus buckets as large as the gradients, FSDP2 without
    resharding keeps the gathered parameters), 10 MiB of activations per sample per rank; the
    speed of each mode and knob from `speeds`."""

    def peak(c):
        bytes_per = {"fp32": 4, "bf16": 2}[c.weights]
        state = {"fp32": 8, "bf16": 4, "8bit": 2}[c.optimizer_state]
        whole = N * (2 * bytes_per + state)
        if c.parallel == "ddp":
            held = whole + N * bytes_per
        else:
            held = whole // c.devices + (0 if c.fsdp_reshard else N * 4)
        return held + 10 * MiB * micro_batch(c, 8) * (1.0 if c.precision == "fp32" else 0.6)

    def speed(c):
        key = (c.parallel, c.fsdp_reshard if c.parallel == "fsdp2" else c.ddp_bucket_mb)
        return speeds[key] * (2 if c.precision == "bf16" else 1)

    return peak, speed


def test_where_only_fsdp2_fits_the_per_gpu_budget_the_search_shards_first():
    fixed = {**GROUP, "precision": "fp32", "weights": "fp32", "optimizer_state": "fp32"}
    space = default_space(CPU, 8, fixed=fixed)
    assert space.values("parallel") == ("ddp", "fsdp2") and space.start().parallel == "ddp"
    peak, speed = _group_device({("ddp", 25): 120, ("ddp", 100): 125, ("fsdp2", True): 100,
                                 ("fsdp2", False): 110})
    budget = 13 * N  # a rank of FSDP2 (8N + 40 MiB) fits; DDP (20N + ..) and no reshard not
    strategy, history, tried = _simulate(space, budget, peak, speed)
    baseline = history.get(space.start())
    assert baseline.peak_memory_bytes > budget  # measured: nothing was known before it
    assert tried[1].parallel == "fsdp2"  # the expert's recipe shards: the lever that fits
    best = history.best()
    assert best.config["parallel"] == "fsdp2" and best.config["fsdp_reshard"] is True
    assert best.peak_memory_bytes <= budget
    # FSDP2 without resharding keeps 4N more per rank: its estimate says it cannot fit, so it
    # never runs; nor do DDP's buckets, around an FSDP2 incumbent.
    sharded = space.canonical(best.tune_config)
    assert sharded.replace(fsdp_reshard=False) not in tried
    assert not any(c.parallel == "ddp" and c.ddp_bucket_mb != 25 for c in tried)


@pytest.mark.parametrize("speeds, winner", [
    ({("ddp", 25): 100, ("ddp", 100): 104, ("fsdp2", True): 105, ("fsdp2", False): 112},
     ("fsdp2", False, 25)),
    ({("ddp", 25): 120, ("ddp", 100): 126, ("fsdp2", True): 105, ("fsdp2", False): 112},
     ("ddp", True, 100)),
])
def test_where_both_fit_the_faster_mode_and_knob_win(speeds, winner):
    space = default_space(CPU, 8, fixed={**GROUP, "precision": "fp32", "weights": "fp32",
                                         "optimizer_state": "fp32"})
    peak, speed = _group_device(speeds)
    _, history, tried = _simulate(space, 64 * N, peak, speed)
    best = history.best()
    assert (best.config["parallel"], best.config["fsdp_reshard"],
            best.config["ddp_bucket_mb"]) == winner
    # Both modes ran, and the winner's own knob around it.
    assert {c.parallel for c in tried} == {"ddp", "fsdp2"}
    if winner[0] == "ddp":
        assert any(c.ddp_bucket_mb == 100 for c in tried)
    else:
        assert any(not c.fsdp_reshard for c in tried)


def test_the_report_names_the_per_gpu_budget_the_global_batch_and_why_fsdp2_won():
    fixed = {**GROUP, "precision": "fp32", "weights": "fp32", "optimizer_state": "fp32"}
    space = default_space(GPU, 8, fixed=fixed)
    peak, speed = _group_device({("ddp", 25): 120, ("ddp", 100): 125, ("fsdp2", True): 100,
                                 ("fsdp2", False): 110})
    budget = 13 * N
    _, history, _ = _simulate(space, budget, peak, speed)
    results = [dataclasses.replace(r, batch_size=8, loss_max_rel_error=1e-6, loss_tolerance=0.01)
               for r in history.all()]
    eligible = [r for r in results if r.status == "ok" and r.peak_memory_bytes <= budget]
    # FSDP2 and, around it, FSDP2 with bf16 reduce and larger batches accumulated (which this
    # pretend device runs no faster: a tie, won by the simplest) ran within the budget.
    tied = tied_leaders(eligible)
    outcome = SearchOutcome(
        results=results, ranked=eligible, eligible=len(eligible), front=eligible,
        recommendation=simplest(tied), reason="", environment={"device": "cuda"}, workload={},
        workload_key="", space=space, budget_bytes=budget)
    reason = explain(outcome)
    assert len(tied) > 1 and reason.startswith(
        f"the simplest of {len(tied)} configurations tied at the top, of {len(eligible)} that ran")
    assert "their first measurements lie 0.0% apart, within their spread (±0.0%); the simpler " \
        "is recommended" in reason
    assert {r.tune_config.parallel for r in eligible} == {"fsdp2"}
    assert "fsdp2 x2 won: 100 tokens/s" in reason
    assert "ddp x2 peaked at" in reason and "per GPU, over the budget" in reason
    assert "global batch 8 = 4 per GPU x 1 accumulation step x 2 GPUs" in reason
    outcome.reason = reason
    text = report(outcome)
    assert f"Memory budget: {fmt.gib(budget)} per GPU (each rank's peak counts against it; " \
           "2 GPUs)" in text
    assert "Recommended global batch 8 = 4 per GPU x 1 accumulation step x 2 GPUs" in text


def test_several_devices_put_ddp_fsdp2_and_their_knobs_in_the_space():
    assert "parallel" not in dict(default_space(CPU, 8).choices)  # one device: nothing new
    space = default_space(CPU, 8, fixed={"devices": 2})
    assert (space.values("parallel"), space.values("fsdp_reshard"),
            space.values("ddp_bucket_mb")) == (("ddp", "fsdp2"), (True, False), (25, 100))
    assert space.devices == 2 and space.start().label() == "fp32 + ddp x2"
    # The micro-batch halves each rank's share (4 of batch 8), not the whole batch.
    assert space.micro_batches(space.start()) == [0, 2, 1]
    assert space.canonical(space.start().replace(micro_batch_size=4)).micro_batch_size == 0
    # A knob of the other mode does nothing: the same run.
    fsdp2 = space.start().replace(parallel="fsdp2")
    assert space.canonical(fsdp2.replace(ddp_bucket_mb=100)) == fsdp2
    assert space.contains(space.canonical(fsdp2.replace(ddp_bucket_mb=100, fsdp_reshard=False)))
    # A mode the user holds brings only its own knob.
    held = default_space(CPU, 8, fixed={"devices": 2, "parallel": "fsdp2"})
    assert "ddp_bucket_mb" not in dict(held.choices)
    assert held.values("fsdp_reshard") == (True, False)
    with pytest.raises(ConfigError, match="devices = 2 but this machine has 1 GPU"):
        check_devices(2, "cuda", {"gpu_count": 1})
    check_devices(2, "cpu", {"gpu_count": 0})  # processes on the CPU


def test_a_configuration_about_as_large_as_one_that_ran_out_of_memory_is_not_tried():
    """Seen in CI: after batch 16 ran out of memory with foreach AdamW, batch 16 with the plain
    one (estimated the same) still had a 2.3% chance, just over the floor, and was run."""
    from tuner_tui.engine.search.fit import NOT_FITTING, Footprint

    space = default_space(CPU, 8, choices={"batch_size": ("x1", "x2"),
                                           "optimizer": ("plain", "foreach")})
    history = History(space, budget_bytes=2**40)
    small = TuneConfig.from_dict({"batch_size": 8})
    history.add(small, _row(small, sum(static_parts(small, N)) + 80 * MiB))  # 10 MiB a sample
    oom = small.replace(batch_size=16, optimizer="foreach")
    history.add(oom, _row(oom, None, status="oom"))
    footprint = Footprint(history, default_batch=8, budget_bytes=2**40)
    assert footprint.chance_to_fit(small.replace(batch_size=16)) < NOT_FITTING
    # An estimate 13% smaller (a quarter fewer samples): more likely to fit than not; the batch
    # that ran: surely.
    assert 0.5 < footprint.chance_to_fit(small.replace(batch_size=12)) < 0.99
    assert footprint.chance_to_fit(small.replace(optimizer="foreach")) > 0.99


def test_a_configuration_that_holds_what_a_measured_one_held_is_judged_by_that_peak():
    """Seen in simulation: with every option that sets the peak the same as a trial measured 8%
    over the budget (only the micro-batches accumulated differ), a certain estimate's 7% doubt
    left a 14% chance to fit, and one search ran a dozen such trials, each over the budget. A
    peak repeats to the MiB (8-bit and bf16 state interleaved on three models, H100): such an
    estimate is that peak, doubted by 1%."""
    from tuner_tui.engine.search.fit import NOT_FITTING, Footprint

    space = default_space(CPU, 8, choices={"batch_size": ("x1", "x2", "x4"),
                                           "optimizer": ("plain", "foreach"),
                                           "checkpointing": ("off", "full")})
    small = TuneConfig.from_dict({"batch_size": 8, "micro_batch_size": 4})
    peak = sum(static_parts(small, N)) + 80 * MiB  # 20 MiB a sample
    history = History(space, budget_bytes=int(peak / 1.04))
    history.add(small, _row(small, peak))
    footprint = Footprint(history, default_batch=8, budget_bytes=int(peak / 1.04))
    for alike in (small.replace(batch_size=16), small.replace(batch_size=32)):
        found = footprint.estimate(alike)
        assert found.alike and found.total == peak
        assert footprint.chance_to_fit(alike) < NOT_FITTING
    # Scaled from it (fewer samples at once; another AdamW, whose step holds its own
    # temporaries): the usual doubt.
    fewer = small.replace(micro_batch_size=2)
    assert not footprint.estimate(fewer).alike and footprint.chance_to_fit(fewer) > 0.95
    assert not footprint.estimate(small.replace(optimizer="foreach")).alike
    lean = small.replace(optimizer_state="bf16")  # 4 bytes a parameter less, computed
    assert not footprint.estimate(lean).alike


def test_an_out_of_memory_trial_estimated_under_the_device_says_nothing_of_what_the_device_holds():
    """Seen in simulation: a baseline that ran out of memory was estimated at half the device
    (what it left out of its estimate took the rest); every configuration of about that
    estimate or more was then held not to fit, on a device that held them, for 30 minutes."""
    from tuner_tui.engine.search.fit import Footprint

    space = default_space(CPU, 8, choices={"batch_size": ("x1", "x2", "x4")})
    history = History(space, budget_bytes=2**40)
    small = TuneConfig.from_dict({"batch_size": 8})
    history.add(small, _row(small, sum(static_parts(small, N)) + 80 * MiB))  # 10 MiB a sample
    oom = small.replace(batch_size=16)
    history.add(oom, _row(oom, None, status="oom"))
    larger = small.replace(batch_size=32)
    estimated = Footprint(history, default_batch=8, budget_bytes=2**40).bytes(oom)
    device = 4 * estimated  # it ran out, so it needed more than the device: the estimate missed
    assert Footprint(history, 8, 2**40).chance_to_fit(larger) < 0.01  # the device unknown
    assert Footprint(history, 8, 2**40, device_bytes=device).chance_to_fit(larger) > 0.99


@pytest.mark.parametrize("check_s, grows", [(0.0, True), (120.0, False)])
def test_the_expert_grows_the_batch_only_where_checking_its_loss_there_is_cheap(check_s, grows):
    # Checking a grown batch's loss needs an fp32 reference run at that batch; where it would
    # take more than a tenth of the time left (a billion-parameter model), the recipe keeps the
    # run's batch, whose reference is known.
    from tuner_tui.engine.search.priors import Context

    space = default_space(GPU, 8, fixed={"attention": "sdpa", "compile_mode": "off",
                                         "optimizer": "plain", "fused_kernels": ()})
    peak, speed = _lever_model()
    budget = 8 * peak(space.start())  # room for a far larger batch
    strategy = AnytimeSearch(space, Context("cuda", False, 8), budget_bytes=budget,
                             time_available=lambda: 300.0,
                             reference_check_s=lambda c: 0.0 if c.batch_size in (0, 8)
                             else check_s)
    history = History(space, budget_bytes=budget)
    start = strategy.next(history).config
    history.add(start, _row(start, peak(start), speed(start)))
    strategy.observe(start, history.get(start), 1.0, history)
    strategy.next(history)
    assert strategy.opening.expert.precision == "bf16"
    assert (strategy.opening.expert.batch_size > 8) is grows


def test_an_fp32_reference_far_past_the_device_is_not_run_on_an_uncertain_estimate():
    """Seen on an H100 (a Qwen2.5-0.5B shape, 79.18 GiB): after a fully checkpointed fp32
    reference at batch 16 (43 GiB), the reference at batch 32 without checkpointing, estimated
    from it at 232 GiB (uncertain: no pair measured checkpointing's saving), was run and ran out
    of memory in 5 s before the checkpointed one ran. The trials are that run's, as they ran."""
    import json
    from pathlib import Path

    from tuner_tui.engine.search.fit import reference_may_fit
    from tuner_tui.engine.search.memory_replay import timeline_order

    path = (Path(__file__).resolve().parents[2] / "benchmarks/results/h100-2026-12-06"
            / "search-hf-qwen-shape-cbfb668/tune-hf.json")
    data = json.loads(path.read_text())
    ran = timeline_order([TrialResult.from_dict(r) for r in data["results"]], data["timeline"])
    before = ran[:[r.label for r in ran].index("fp32 + sdpa + batch 32")]
    device = data["environment"]["gpu_memory_bytes"]
    batch = data["workload"]["default_batch_size"]
    plain = TuneConfig.from_dict({"attention": "sdpa", "batch_size": 32})
    checkpointed = plain.replace(checkpointing="full")
    assert not reference_may_fit(plain, before, batch, device)
    assert reference_may_fit(checkpointed, before, batch, device)  # it ran: 65 GiB
    # At the run's batch, before anything measured a peak, the plain reference was judged by
    # the model's shapes (the fp32 baseline had run out of memory): not run there either.
    assert not reference_may_fit(plain.replace(batch_size=16), ran[:1], batch, device)

"""The memory model against the committed H200 results (a regression test of its GPU figures),
and its shape priors on tiny models, by their arithmetic."""

from dataclasses import replace
from pathlib import Path

import pytest

from strategies.config import TuneConfig
from tuner_tui.engine.model_shape import model_shape
from tuner_tui.engine.protocol import TrialResult, measured_peak
from tuner_tui.engine.search.memory import estimate, fixed_bytes, holds_at_least
from tuner_tui.engine.search.memory_prior import (
    ModelShape, autocast_copy_bytes, optimizer_copy_bytes, per_sample_bytes,
)
from tuner_tui.engine.search.memory_replay import replay_file, run_order, timeline_order

H200 = Path(__file__).resolve().parents[2] / "benchmarks/results/h200-2026-11-30"
COMMITTED = ["call1-fit/tune-hf-recipe-budget.json", "call1-fit/tune-hf-llama-24gib.json",
             "call2-fit-recipe/tune-hf-recipe-budget.json",
             "call7-fit-recipe/tune-hf-recipe-budget.json", "call6-fit-probe/bench-hf-probe.json",
             "call1-fit/bench-hf-llama-levers.json",
             "call10-parallel-hf-two-tune/tune-2gpu-24gib.json",  # two GPUs: DDP, FSDP2
             "call17-fit-recipe-lean/tune-hf-recipe-lean.json",
             "call18-fit-llama/tune-llama-1b-recipe-lean.json",  # the built-in llama-1b
             "call3-why/why-profiles.json",  # GPT-2 124M at batch 16, 1 and 64 (CUDA graphs)
             # each memory lever alone beside the fp32 reference, on both models; llama-1b at
             # 24 GiB
             "../h200-2026-12-01/call23-fit-free-hf/tune-hf-llama-free.json",
             "../h200-2026-12-01/call25-fit-free-llama/tune-llama-1b-free.json",
             "../h200-2026-12-01/call24-fit-24-llama/tune-llama-1b-24gib.json",
             "../h200-2026-12-01/call29-fit-free-llama/tune-llama-1b-free.json",
             "../h200-2026-12-01/call30-fit-graphs-hf/bench-hf-llama-graphs.json",
             # GPT-2 124M in eager with the fused kernels beside the same without
             "../h200-2026-12-01/call31-host-and-kernels-e2e/bench-gpt2-kernels-e2e.json",
             # the HF Llama at 16 and 24 GiB, in the order of the files' time lines
             "../h200-2026-12-03/search-hf16-fit/tune-hf16.json",
             "../h200-2026-12-03/search-hf24-fit/tune-hf24.json"]

# Rows the model is known to miss by more than 15%, and why. CUDA graphs' private pool: GPT-2 at
# batch 64 under reduce-overhead reserved 39.6 GiB against 28.5 allocated, an overhead nothing
# else measured shows (at batch 16, and on the HF Llama, reduce-overhead held what default did).
# GPT-2's fp32 baseline (manual attention), the file's first trial, estimated from the shapes
# alone: 34.7 GiB against 29.6 measured here and 31.9 in bench-gpt2-124m-h200.json (the same
# configuration); the softmax weights manual attention keeps count 9.0 GiB of it, measured
# 7.6-10 over SDPA.
KNOWN_MISSES = {("call3-why/why-profiles.json",
                 "bf16 + sdpa + compile(reduce-overhead) + fused AdamW + batch 64"),
                ("call3-why/why-profiles.json", "fp32")}


@pytest.mark.parametrize("name", COMMITTED)
def test_every_trial_that_ran_on_the_h200_is_estimated_within_15_percent(name):
    rows = replay_file(H200 / name)
    checked = [r for r in rows if r.error is not None and (name, r.result.label) not in KNOWN_MISSES]
    assert checked, "nothing to compare"
    worst = max(checked, key=lambda r: abs(r.error))
    assert abs(worst.error) <= 0.15, (worst.result.label, worst.error)


def test_a_tune_file_is_replayed_in_the_order_its_log_shows():
    a, b = (TrialResult(config={}, label=x, status="ok") for x in ("A", "B"))
    log = ("[1/2 | 0m01s elapsed] B: 5.0k tokens/s\n[2/2 | 0m09s elapsed] A: starting worker\n"
           "[1/2 | re-measuring the leaders, interleaved] A: building\n")
    assert [r.label for r in run_order([a, b], log)] == ["B", "A"]


def test_a_tune_file_with_a_time_line_is_replayed_in_its_order():
    a, b, c = (TrialResult(config={}, label=x, status="ok") for x in ("A", "B", "C"))
    timeline = [{"kind": "trial", "label": "B"}, {"kind": "trial", "label": "A"},
                {"kind": "remeasure", "label": "C"}, {"kind": "remeasure", "label": "A"}]
    assert [r.label for r in timeline_order([a, b, c], timeline)] == ["B", "A", "C"]


TINY = ModelShape(layers=2, hidden=64, intermediate=176, heads=4, kv_heads=2, vocab=512,
                  seq_len=64)
BASE = TuneConfig().replace(precision="bf16", weights="bf16", attention="sdpa",
                            compile_mode="default")


def test_the_fused_loss_saves_the_logits_in_two_dtypes():
    fused = BASE.replace(fused_kernels=("linear_cross_entropy",))
    saved = per_sample_bytes(BASE, TINY) - per_sample_bytes(fused, TINY)
    assert saved == 64 * 512 * (2 + 4)  # tokens x vocab x (bf16 logits + their fp32 copy)


def test_checkpointing_keeps_less_and_full_least():
    off, sel, full = (per_sample_bytes(BASE.replace(checkpointing=m), TINY)
                      for m in ("off", "selective", "full"))
    assert full < sel < off
    # full keeps each block's input, one block recomputed whole, and the logits
    one_block = (5 * 64 + 2 * 32 + 3 * 176) * 2
    assert full == 64 * (2 * 64 * 2 + one_block + 512 * 6)


def test_fp8_keeps_the_linears_inputs_in_one_byte():
    fp8 = BASE.replace(fp8="tensorwise")
    assert per_sample_bytes(BASE, TINY) - per_sample_bytes(fp8, TINY) == 64 * 2 * (2 * 64 + 176)


def test_manual_attention_keeps_its_softmax_weights_in_fp32_and_their_half_copy():
    tokens_layers_heads_seq = 64 * 2 * 4 * 64
    mha = ModelShape(**{**TINY.to_dict(), "kv_heads": 4})
    for config, per_score in ((BASE, 4 + 2), (BASE.replace(precision="fp32", weights="fp32"), 4)):
        manual = config.replace(attention="manual")
        scores = per_sample_bytes(manual, mha) - per_sample_bytes(config, mha)
        assert scores == tokens_layers_heads_seq * per_score
    # fp32 grouped-query SDPA takes the math path, which keeps them too
    fp32 = BASE.replace(precision="fp32", weights="fp32")
    assert per_sample_bytes(fp32.replace(attention="manual"), TINY) == per_sample_bytes(fp32, TINY)


def test_fp32_grouped_query_attention_keeps_the_softmax_weights():
    fp32 = TuneConfig().replace(precision="fp32", attention="sdpa", compile_mode="default")
    mha = ModelShape(**{**TINY.to_dict(), "kv_heads": 4})
    with_scores = per_sample_bytes(fp32, TINY) - per_sample_bytes(fp32, mha)
    kv_saved = 64 * 2 * 2 * (64 - 32) * 4  # mha's larger k/v, 2 layers, fp32
    assert with_scores + kv_saved == 64 * 2 * 4 * 64 * 4  # tokens x layers x heads x seq x fp32


def test_autocast_keeps_weight_copies_and_torchaos_step_upcasts_the_largest_matrix():
    n = 10**6
    autocast = TuneConfig().replace(precision="bf16")
    assert autocast_copy_bytes(autocast, n) == 2 * n
    assert optimizer_copy_bytes(autocast, TINY) == 0  # torch's AdamW: no fp32 working copies
    assert autocast_copy_bytes(BASE, n) == 0  # bf16 weights: nothing to cast
    assert optimizer_copy_bytes(BASE, TINY) == 16 * 512 * 64  # param, grad, 2 moments in fp32
    assert optimizer_copy_bytes(autocast.replace(optimizer_state="8bit"), TINY) == 16 * 512 * 64


def _trial(config: TuneConfig, peak: int, n_params: int) -> TrialResult:
    return TrialResult(config=config.to_dict(), label=config.label(), status="ok",
                       peak_memory_bytes=peak,
                       memory_parts={"parameters": 2 * n_params, "gradients": 2 * n_params,
                                     "optimizer_state": 4 * n_params},
                       model_shape=TINY.to_dict())


def test_under_fsdp2_the_step_part_is_per_shard_and_has_no_autocast_copies():
    """FSDP2 gathers each block's parameters in the compute dtype (no whole-model autocast
    copies) and torchao's AdamW upcasts this device's shard of each tensor, not the whole."""
    n = 10_000_000
    autocast = BASE.replace(weights="fp32", optimizer_state="fp32", compile_mode="off")
    fsdp = {"parallel": "fsdp2", "devices": 4}
    assert autocast_copy_bytes(autocast.replace(**fsdp), n) == 0
    assert optimizer_copy_bytes(BASE.replace(**fsdp), TINY) == optimizer_copy_bytes(BASE, TINY) / 4
    assert autocast_copy_bytes(autocast.replace(parallel="ddp", devices=4), n) == 2 * n


def test_the_fused_swiglu_keeps_one_intermediate_vector_less_in_eager():
    eager = BASE.replace(compile_mode="off")
    fused = eager.replace(fused_kernels=("swiglu",))
    saved = per_sample_bytes(eager, TINY) - per_sample_bytes(fused, TINY)
    assert saved == TINY.seq_len * TINY.layers * TINY.intermediate * 2  # bf16
    # Under compile Inductor fuses the MLP itself (inductor-first leaves SwiGLU to it).
    compiled = BASE.replace(fused_kernels=("swiglu",))
    assert per_sample_bytes(compiled, TINY) == per_sample_bytes(BASE, TINY)


def _autocast_trial(config: TuneConfig, rest: int, n: int) -> TrialResult:
    peak = fixed_bytes(config, n) + autocast_copy_bytes(config, n) + rest
    return TrialResult(config=config.to_dict(), label=config.label(), status="ok",
                       peak_memory_bytes=int(peak), model_shape=TINY.to_dict(),
                       memory_parts={"parameters": 4 * n, "gradients": 4 * n,
                                     "optimizer_state": 8 * n})


AUTOCAST = TuneConfig().replace(precision="bf16", batch_size=8)  # eager


def test_autocasts_weight_copies_do_not_scale_with_the_micro_batch():
    n = 10**5
    assert autocast_copy_bytes(AUTOCAST, n) == 2 * n
    trial = _autocast_trial(AUTOCAST, 8 * 1000, n)
    half = estimate(AUTOCAST.replace(micro_batch_size=4), [trial], 8)
    assert half.certain
    assert half.total == fixed_bytes(AUTOCAST, n) + 2 * n + 4 * 1000


def test_under_compile_autocast_keeps_weight_copies_only_where_nothing_recasts_them():
    """On the H200, compiled: selective checkpointing and fp8 each saved 2-3 GB more on fp32
    weights than on bf16 weights (the linears' bf16 copies); counting copies under selective
    checkpointing had put an HF Llama 20% over."""
    n = 10**5
    compiled = AUTOCAST.replace(compile_mode="default")
    assert autocast_copy_bytes(compiled, n) == 2 * n
    assert autocast_copy_bytes(compiled.replace(checkpointing="selective"), n) == 0
    assert autocast_copy_bytes(compiled.replace(fp8="tensorwise"), n) == 0
    assert autocast_copy_bytes(compiled.replace(weights="bf16"), n) == 0
    assert autocast_copy_bytes(AUTOCAST.replace(checkpointing="selective"), n) == 2 * n  # eager


def test_the_built_in_models_loss_keeps_no_fp32_logits():
    """HF's loss takes `logits.float()`; the built-in models' does not, and under compile (no
    CUDA graphs) it fuses into a kernel that keeps the logits alone. In eager the built-in loss
    runs in fp32 (autocast's policy) and holds two fp32 buffers beside the logits, 2 bytes a
    logit more than HF's loss does (by the committed HF files)."""
    hf, built_in = TINY, replace(TINY, loss_in_fp32=False)
    tokens_vocab = 64 * 512
    for mode, extra in (("off", 6), ("default", 0), ("reduce-overhead", 4)):
        c = BASE.replace(compile_mode=mode)
        assert per_sample_bytes(c, hf) - per_sample_bytes(c, built_in) == tokens_vocab * (4 - extra)
    assert ModelShape.from_dict(built_in.to_dict()) == built_in
    assert "loss_in_fp32" not in hf.to_dict()


def test_a_whole_model_graph_that_accumulates_holds_a_second_set_of_gradients():
    """Seen on the H200: compiled, micro-batch 2 of 4 held the bf16 gradients (2.8 GiB) more
    than its activations: the graph returns the new gradients at once, beside the old."""
    n = 10**5
    compiled = AUTOCAST.replace(compile_mode="default")
    trial = _autocast_trial(compiled, 8 * 1000, n)
    half = estimate(compiled.replace(micro_batch_size=4), [trial], 8)
    grads = 4 * n  # fp32 weights: fp32 gradients
    copies = 2 * n  # autocast's bf16 copies, kept without checkpointing or fp8
    assert half.total == fixed_bytes(compiled, n) + copies + 4 * 1000 + grads
    # per block, each block's graph returns only its own gradients: not counted
    blocks = compiled.replace(compile_scope="block")
    trial = _autocast_trial(blocks, 8 * 1000, n)
    assert estimate(blocks.replace(micro_batch_size=4), [trial], 8).total == \
        fixed_bytes(blocks, n) + copies + 4 * 1000


def test_the_optimizer_steps_copies_do_not_add_to_the_activations():
    """torchao's AdamW upcasts per tensor after the backward has freed the activations: the
    peak is the larger of the two (adding them put an HF Llama's estimate 23% over)."""
    n = 10**5
    measured = BASE.replace(batch_size=8, optimizer_state="bf16")
    copies = optimizer_copy_bytes(measured, TINY)
    big = 8 * copies  # activations well above the step's copies
    trial = _trial(measured, 8 * n + big, n)
    assert estimate(measured.replace(batch_size=16), [trial], 8).total == 8 * n + 2 * big
    # a micro-batch whose activations fall under the copies: the copies set the peak
    tiny = estimate(measured.replace(micro_batch_size=1, compile_scope="block"), [trial], 8)
    assert tiny.total == 8 * n + copies


def test_a_trial_whose_peak_the_optimizer_step_set_does_not_scale_its_copies():
    """A full-checkpointing trial's peak was the step's 4 GiB of fp32 copies; taken for
    activations and scaled up to no checkpointing, the estimate was 6x the measured peak."""
    n = 10**5
    measured = BASE.replace(batch_size=8, optimizer_state="bf16", checkpointing="full")
    copies = optimizer_copy_bytes(measured, TINY)
    trial = _trial(measured, 8 * n + copies, n)  # the step set the peak
    target = measured.replace(checkpointing="off")
    found = estimate(target, [trial], 8)
    assert not found.certain
    prior = 8 * per_sample_bytes(target, TINY)
    assert found.total <= 8 * n + max(copies, prior * copies / (8 * per_sample_bytes(measured, TINY)))


def test_an_unmeasured_option_is_scaled_by_its_prior_and_stays_uncertain():
    n = 10**5
    measured = BASE.replace(batch_size=8, optimizer_state="bf16")
    per_sample = per_sample_bytes(measured, TINY)
    trial = _trial(measured, int(8 * n + 8 * per_sample), n)
    target = measured.replace(checkpointing="full")
    found = estimate(target, [trial], 8)
    assert not found.certain
    expected = 8 * n + max(8 * per_sample_bytes(target, TINY), optimizer_copy_bytes(target, TINY))
    assert found.total == pytest.approx(expected, abs=8)


def test_the_shape_is_read_from_a_hugging_face_config():
    class Config:
        hidden_size, num_attention_heads, num_hidden_layers, vocab_size = 64, 4, 2, 512
        intermediate_size, num_key_value_heads = 176, 2

    class Model:
        config = Config()

    assert model_shape(Model(), 64) == TINY.to_dict()
    assert model_shape(object(), 64) == {}


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_the_built_in_models_say_how_their_loss_and_attention_keep_memory(name):
    from tuner_tui.engine.workloads import GPT_SHAPES, LLAMA_SHAPES, gpt, llama

    if name in GPT_SHAPES:
        model, repeats = gpt.GPT(GPT_SHAPES[name][0]), False
    else:
        model, repeats = llama.Llama(LLAMA_SHAPES[name][0]), True
    shape = ModelShape.from_dict(model_shape(model, 64))
    assert shape is not None and not shape.loss_in_fp32 and shape.kv_repeated == repeats


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"


def test_the_declared_memory_orders_hold_in_every_committed_gpu_file():
    """Every pair of measured trials of one committed GPU file that the options' declared orders
    compare (`holds_at_least`: the same but for checkpointing, float8 under compile, state and
    weights bytes, a larger micro-batch) peaked in that order, within 2%."""
    compared = 0
    for path in sorted(RESULTS.glob("**/*.json")):
        try:
            rows = replay_file(path)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a tune or bench file
        measured = [(r.result.tune_config, r.result) for r in rows
                    if r.peak and r.result.status in ("ok", "stopped")]
        for config, result in measured:
            batch = result.batch_size or 0
            for other, other_result in measured:
                if config != other and holds_at_least(config, other, batch):
                    compared += 1
                    assert measured_peak(result) >= 0.98 * measured_peak(other_result), (
                        path, result.label, other_result.label)
    print(f"{compared} pairs compared")
    assert compared > 100

"""The memory model against the committed H200 results (a regression test of its GPU figures),
and its shape priors on tiny models, by their arithmetic."""

from pathlib import Path

import pytest

from strategies.config import TuneConfig
from tuner_tui.engine.model_shape import model_shape
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.memory import estimate
from tuner_tui.engine.search.memory_prior import ModelShape, per_sample_bytes, step_bytes
from tuner_tui.engine.search.memory_replay import replay_file, run_order

H200 = Path(__file__).resolve().parents[2] / "benchmarks/results/h200-2026-11-30"
COMMITTED = ["call1-fit/tune-hf-recipe-budget.json", "call1-fit/tune-hf-llama-24gib.json",
             "call2-fit-recipe/tune-hf-recipe-budget.json",
             "call7-fit-recipe/tune-hf-recipe-budget.json", "call6-fit-probe/bench-hf-probe.json",
             "call1-fit/bench-hf-llama-levers.json",
             "call10-parallel-hf-two-tune/tune-2gpu-24gib.json"]  # two GPUs: DDP, FSDP2


@pytest.mark.parametrize("name", COMMITTED)
def test_every_trial_that_ran_on_the_h200_is_estimated_within_15_percent(name):
    rows = replay_file(H200 / name)
    checked = [r for r in rows if r.error is not None]
    assert checked, "nothing to compare"
    worst = max(checked, key=lambda r: abs(r.error))
    assert abs(worst.error) <= 0.15, (worst.result.label, worst.error)


def test_a_tune_file_is_replayed_in_the_order_its_log_shows():
    a, b = (TrialResult(config={}, label=x, status="ok") for x in ("A", "B"))
    log = ("[1/2 | 0m01s elapsed] B: 5.0k tokens/s\n[2/2 | 0m09s elapsed] A: starting worker\n"
           "[1/2 | re-measuring the leaders, interleaved] A: building\n")
    assert [r.label for r in run_order([a, b], log)] == ["B", "A"]


TINY = ModelShape(layers=2, hidden=64, intermediate=176, heads=4, kv_heads=2, vocab=512,
                  seq_len=64)
BASE = TuneConfig().replace(precision="bf16", weights="bf16", compile_mode="default")


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


def test_fp32_grouped_query_attention_keeps_the_softmax_weights():
    fp32 = TuneConfig().replace(precision="fp32", compile_mode="default")
    mha = ModelShape(**{**TINY.to_dict(), "kv_heads": 4})
    with_scores = per_sample_bytes(fp32, TINY) - per_sample_bytes(fp32, mha)
    kv_saved = 64 * 2 * 2 * (64 - 32) * 4  # mha's larger k/v, 2 layers, fp32
    assert with_scores + kv_saved == 64 * 2 * 4 * 64 * 4  # tokens x layers x heads x seq x fp32


def test_a_step_holds_the_larger_of_autocast_copies_and_the_optimizers_fp32_copies():
    n = 10**6
    autocast = TuneConfig().replace(precision="bf16")
    assert step_bytes(autocast, TINY, n) == 2 * n
    assert step_bytes(BASE, TINY, n) == 16 * 512 * 64
    assert step_bytes(autocast.replace(optimizer_state="8bit"), TINY, n) == max(2 * n, 16 * 512 * 64)


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
    autocast = BASE.replace(weights="fp32", optimizer_state="fp32")
    fsdp = {"parallel": "fsdp2", "devices": 4}
    assert step_bytes(autocast.replace(**fsdp), TINY, n) == 0
    assert step_bytes(BASE.replace(**fsdp), TINY, n) == step_bytes(BASE, TINY, n) / 4
    assert step_bytes(autocast.replace(parallel="ddp", devices=4), TINY, n) == 2 * n


def test_the_fused_swiglu_keeps_one_intermediate_vector_less_in_eager():
    eager = BASE.replace(compile_mode="off")
    fused = eager.replace(fused_kernels=("swiglu",))
    saved = per_sample_bytes(eager, TINY) - per_sample_bytes(fused, TINY)
    assert saved == TINY.seq_len * TINY.layers * TINY.intermediate * 2  # bf16
    # Under compile Inductor fuses the MLP itself (inductor-first leaves SwiGLU to it).
    compiled = BASE.replace(fused_kernels=("swiglu",))
    assert per_sample_bytes(compiled, TINY) == per_sample_bytes(BASE, TINY)


def test_the_step_part_does_not_scale_with_the_micro_batch():
    n = 10**5
    measured = BASE.replace(batch_size=8, optimizer_state="bf16")
    once = step_bytes(measured, TINY, n)
    peak = 8 * n + once + 8 * 1000
    half = estimate(measured.replace(micro_batch_size=4), [_trial(measured, peak, n)], 8)
    assert half.certain and half.total == 8 * n + once + 4 * 1000


def test_an_unmeasured_option_is_scaled_by_its_prior_and_stays_uncertain():
    n = 10**5
    measured = BASE.replace(batch_size=8, optimizer_state="bf16")
    once = step_bytes(measured, TINY, n)
    per_sample = per_sample_bytes(measured, TINY)
    trial = _trial(measured, int(8 * n + once + 8 * per_sample), n)
    target = measured.replace(checkpointing="full")
    found = estimate(target, [trial], 8)
    assert not found.certain
    assert found.total == pytest.approx(8 * n + once + 8 * per_sample_bytes(target, TINY), abs=8)


def test_the_shape_is_read_from_a_hugging_face_config():
    class Config:
        hidden_size, num_attention_heads, num_hidden_layers, vocab_size = 64, 4, 2, 512
        intermediate_size, num_key_value_heads = 176, 2

    class Model:
        config = Config()

    assert model_shape(Model(), 64) == TINY.to_dict()
    assert model_shape(object(), 64) == {}

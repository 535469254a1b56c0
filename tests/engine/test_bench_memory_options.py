"""`gputune bench` end to end on the CPU with the memory options, with real workers."""

import json


def test_bench_with_bf16_weights_and_micro_batches(gputune, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[config]\nmicro_batch_size = 4\n")
    out = tmp_path / "b.json"
    # (16 tokens a sample, not 64: bf16 steps on the CPU are slow; the figures checked are of
    # the weights and the optimizer, and the activations only > 0)
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--seq-len", "16",
                   "--config", str(cfg),
                   "--set", "weights=bf16", "--set", "precision=bf16", "--steps", "2",
                   "--warmup", "1", "--json", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["loss_ok"] is True, row
    assert row["label"] == "bf16 + bf16 weights + micro 4"
    assert row["batch_size"] == 8 and row["config"]["micro_batch_size"] == 4
    assert row["strategy_report"]["weights"]["dtype"] == "bf16"
    assert row["strategy_report"]["optimizer"]["stochastic_rounding"] is True
    parts = row["memory_parts"]
    assert parts["parameters"] == parts["gradients"] > 0  # bf16 gradients of bf16 weights
    assert parts["optimizer_state"] >= 4 * parts["parameters"]  # fp32 moments: 2 x 4 bytes
    # The only row has no trial before it: its estimate is from its parameters and shapes.
    est = row["memory_estimate"]
    assert est["basis"] == "the model's shapes" and est["certain"] is False
    assert est["parameters"] == parts["parameters"] and est["activations"] > 0


def test_bench_refuses_a_bad_combination_before_running(gputune):
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny",
                   "--set", "weights=bf16", "--steps", "1")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "weights = bf16 needs precision = bf16" in line and "precision = fp32" in line

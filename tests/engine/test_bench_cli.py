"""`gputune bench` end to end on the CPU, with real workers."""

import json

import pytest

from shared_runs import QUICK_BENCH
from strategies import load


@pytest.mark.slow
def test_default_ladder_on_cpu_runs_end_to_end_and_writes_json(gputune, tmp_path):
    out = tmp_path / "bench.json"
    # (--remeasure 0: the leaders' re-measurement is tested on its own, test_bench_re_measures_the_two_leaders_*,
    # and it doubled this test's time; checkpointing held off: its rung, the last, compiles a
    # graph of its own for 37 s and becomes the rung before it, which the ladder then drops as a
    # repeat; the ladder's rungs are checked whole in tests/strategies/test_applicability.py;
    # the optimizer held plain: the fused AdamW rung, a second compiled run, becomes a repeat of
    # the one before it and is skipped as one; compile held off: its rung compiled for 38 s of
    # this test's 61 on 2 cores, and a compiled trial through the worker is tested on its own,
    # test_search.py's test_the_one_compiled_trial_*; 16 tokens a sample, not 64: bf16 steps
    # on the CPU are slow, and nothing here depends on the length)
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--seq-len", "16",
                   "--steps", "2", "--warmup", "1", "--json", str(out),
                   "--export", str(tmp_path / "best.toml"), "--remeasure", "0",
                   "--set", "checkpointing=off", "--set", "optimizer=plain",
                   "--set", "compile_mode=off", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    env = doc["environment"]
    for key in ("gpu_name", "driver", "torch", "triton", "cuda", "host"):
        assert key in env
    results = doc["results"]
    labels = [r["label"] for r in results]
    # The baseline first, then one family at a time; rows needing CUDA are skipped, with a note.
    assert labels[:3] == ["fp32", "bf16", "bf16 + sdpa"]
    assert not any("tf32" in lbl or "reduce-overhead" in lbl for lbl in labels)
    assert "skipped tf32" in proc.stdout
    for r in results:
        for key in ("config", "status", "tokens_per_s", "step_ms", "mfu", "peak_memory_bytes",
                    "compile_s", "loss_ok"):
            assert key in r
        assert r["status"] == "ok", r
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0
    assert all(r["loss_ok"] for r in results[1:])
    assert "x first" in proc.stdout
    exported = load(tmp_path / "best.toml")
    assert exported.to_dict() in [r["config"] for r in results]


def test_user_workload_and_config_files(gputune, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[config]\nprecision = 'bf16'\noptimizer = 'foreach'\nbatch_size = 16\n")
    out = tmp_path / "b.json"
    proc = gputune("bench", "--device", "cpu", "--workload", "tests.engine.user_workloads:tiny_mlp",
                   "--config", str(cfg), "--steps", "3", "--warmup", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["batch_size"] == 16 and row["config"]["optimizer"] == "foreach"
    assert row["loss_ok"] is True  # checked against a reference run made for batch 16
    assert "fp32 reference losses (batch 16)" in proc.stdout


@pytest.mark.xdist_group(QUICK_BENCH)
def test_text_file_data(quick_bench):
    # `bench --preset quick --data corpus.txt` (conftest.py; profiled too, for test_profile.py)
    proc, _ = quick_bench
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok") >= 2


def test_bench_hands_over_each_row_as_it_is_measured():
    """So `--json` keeps the rows measured before a bench is cut short."""
    import io

    from strategies.config import TuneConfig
    from tuner_tui.engine import bench
    from tuner_tui.engine.protocol import WorkerSpec

    configs = [TuneConfig(), TuneConfig().replace(optimizer="foreach")]
    plan = bench.BenchPlan(WorkerSpec(workload="gpt2-tiny", device="cpu"), configs, steps=2,
                           warmup_steps=1)
    seen = []
    results, environment, _ = bench.run_bench(
        plan, out=io.StringIO(), on_result=lambda rows, env, wl: seen.append(
            ([r.config["optimizer"] for r in rows], env["torch"], wl["name"]))
    )
    torch_version = environment["torch"]
    assert seen == [(["plain"], torch_version, "gpt2-tiny"),
                    (["plain", "foreach"], torch_version, "gpt2-tiny")]
    assert [r.status for r in results] == ["ok", "ok"]


def test_bench_records_in_the_store_reuses_it_and_fresh_measures_again(gputune, tmp_path):
    from tuner_tui.engine.store import ResultStore

    cfg = tmp_path / "c.toml"
    cfg.write_text("[config]\noptimizer = 'foreach'\n")
    store = tmp_path / "s.sqlite3"
    args = ["bench", "--device", "cpu", "--workload", "tests.engine.user_workloads:tiny_mlp",
            "--config", str(cfg), "--steps", "2", "--warmup", "1", "--store", str(store)]
    first = gputune(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "reused from the store" not in first.stdout and "spread" in first.stdout
    with ResultStore(store) as s:
        (row,) = s.past()
    # A user's workload is keyed by its code too: its function and a hash of its module.
    assert row.source == "bench" and row.workload.startswith(
        "tiny-mlp seq=1 seed=0 synthetic code=tests.engine.user_workloads.tiny_mlp@")
    assert row.fingerprint["code"] and row.fingerprint["gputune"]
    # Run again: the stored row is reused. A configuration listed twice is measured twice, even
    # where the store holds it: its first listing is the reused row, the second is measured.
    twice = gputune(*args, "--config", str(cfg), "--remeasure", "0")
    assert twice.returncode == 0, twice.stderr[-3000:]
    assert "reused from the store (--fresh measures again)" in twice.stdout
    assert twice.stdout.count("reused from the store") == 1
    with ResultStore(store) as s:
        (row,) = s.past()  # (the repeat's measurement, stored)
    fresh = gputune(*args, "--fresh")
    assert fresh.returncode == 0 and "reused from the store" not in fresh.stdout
    with ResultStore(store) as s:
        (newer,) = s.past()
    assert newer.created > row.created


def test_bench_re_measures_the_two_leaders_interleaved_before_naming_the_best():
    import io

    from strategies.config import TuneConfig
    from tuner_tui.engine import bench
    from tuner_tui.engine.protocol import TrialResult, WorkerSpec

    # Two rows 1% apart: one measurement cannot order them.
    plain, foreach = TuneConfig(), TuneConfig().replace(optimizer="foreach")
    rows = [TrialResult(config=c.to_dict(), label=c.label(), status="ok", tokens_per_s=t,
                        step_ms=1.0, step_ms_q1=0.99, step_ms_q3=1.01)
            for c, t in ((foreach, 1010.0), (plain, 1000.0))]
    plan = bench.BenchPlan(WorkerSpec(workload="tests.engine.user_workloads:tiny_mlp", device="cpu"),
                           [], steps=2, warmup_steps=1, remeasure_repeats=1)
    out = io.StringIO()
    top, verdict = bench.remeasure_best(plan, rows, out)
    assert [c.label for c in verdict.candidates] == [rows[0].label, rows[1].label]
    assert all(len(c.repeats) == 1 and c.repeats[0].status == "ok" for c in verdict.candidates)
    assert all(c.repeats[0].grad_ok is True for c in verdict.candidates)  # gated again
    assert top is verdict.winner and top in rows
    assert "re-measuring the leaders" in out.getvalue()


def test_a_reference_that_runs_out_of_memory_part_way_checks_no_loss(gputune, tmp_path):
    """The fp32 reference runs out of memory after one loss, however it is split: bench tries
    each rung as tune does, and the row is left unchecked, not checked against that one loss.
    The model has no repeated blocks: full checkpointing would be the plain run again."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[config]\nprecision = 'bf16'\n")
    out = tmp_path / "b.json"
    proc = gputune("bench", "--device", "cpu", "--workload",
                   "tests.engine.user_workloads:oom_after_one_fp32_step", "--config", str(cfg),
                   "--steps", "3", "--warmup", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["loss_ok"] is None, row
    for how in ("", ", one sample at a time"):
        assert f"fp32 reference losses (batch 8{how}): oom" in proc.stdout, proc.stdout
    assert "full checkpointing" not in proc.stdout


def test_bench_runs_no_reference_rung_that_is_a_row_it_ran_already():
    # An MLP whose every parameter was frozen crashed its fp32 row, and bench ran it again as
    # "fp32 + sdpa", its reference (SDPA changes nothing in an MLP). A rung this bench ran
    # already decides as its row did: a crash ends the ladder, out of memory goes on.
    import io

    from strategies.config import TuneConfig
    from tuner_tui.engine.bench import _reference_losses
    from tuner_tui.engine.progress import Progress
    from tuner_tui.engine.protocol import TrialResult

    baseline = TuneConfig.from_dict({})
    crashed = TrialResult(config=baseline.to_dict(), label="fp32", status="crash",
                          message="RuntimeError: element 0 of tensors does not require grad")
    ran = {json.dumps(baseline.to_dict(), sort_keys=True): crashed}
    why = {"attention": "no attention module", "checkpointing": "no repeated blocks"}
    losses, client = _reference_losses("the worker", None, baseline.replace(precision="bf16"),
                                       8, 2, 4, Progress(io.StringIO()), why, ran)
    assert losses == () and client == "the worker"  # no worker was asked to run anything


def test_bench_of_a_workload_whose_own_code_fails_says_so(gputune, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[config]\nprecision = 'fp32'\n")
    proc = gputune("bench", "--device", "cpu", "--workload",
                   "tests.engine.user_workloads:frozen_mlp", "--config", str(cfg),
                   "--steps", "2", "--warmup", "1")
    assert proc.returncode == 1, proc.stderr[-3000:]  # (no row measured)
    assert ("every row raised the fp32 row's error (your model and code as written): "
            "RuntimeError: element 0 of tensors does not require grad") in proc.stdout, proc.stdout

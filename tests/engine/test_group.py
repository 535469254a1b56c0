"""Worker groups on the CPU (gloo, 2 processes): DDP and FSDP2 train as one process would on the
same global batch, and a rank that dies, runs out of memory or hangs ends its group at once."""

from strategies.config import TuneConfig
import json
import math
import os
import signal
import time

import psutil
import pytest

from tuner_tui.engine import protocol as P
from tuner_tui.engine.client import WorkerClient, WorkerSpec
from shared_runs import SHARED_GPT2_WORKER
from worker_events import until

# fp32 on the CPU: DDP and FSDP2 reduce the gradients in another order than one backward pass
# over the whole batch, so the losses differ by rounding only.
LOSS_RTOL = 1e-4




def _ranks(client) -> list[psutil.Process]:
    """The worker's rank processes, rank 0 first (they are started in rank order)."""
    children = psutil.Process(client.pid).children()
    ranks = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    return sorted(ranks, key=lambda p: p.create_time())


@pytest.fixture
def worker():
    clients = []

    def start(**spec):
        c = WorkerClient(WorkerSpec(**{"workload": "gpt2-tiny", "device": "cpu", **spec}))
        c.start()
        until(c, (P.WorkerReady,))
        clients.append(c)
        return c

    yield start
    for c in clients:
        pid = c.pid
        left = psutil.Process(pid).children(recursive=True) if psutil.pid_exists(pid) else []
        c.stop()
        psutil.wait_procs(left, timeout=10)
        assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_ddp_and_fsdp2_give_the_loss_of_one_process_on_the_same_global_batch(group_trials):
    # The trials: ddp x2, fsdp2 x2 and one process, batch 8, in one worker (conftest.py).
    rows = group_trials
    one, _ = rows["none"]
    assert len(one.losses) == 4 and one.per_rank == ()
    for parallel in ("ddp", "fsdp2"):
        result, steps = rows[parallel]
        assert result.status == "ok" and result.batch_size == 8, result
        for got, want in zip(result.losses, one.losses, strict=True):
            assert math.isclose(got, want, rel_tol=LOSS_RTOL), (parallel, result.losses, one.losses)
        # The group's figures: both ranks' step times, the slowest is the step's time.
        assert [r["rank"] for r in result.per_rank] == [0, 1]
        assert all(r["step_ms"] > 0 and r["peak_memory_bytes"] is not None for r in result.per_rank)
        for step in steps:
            assert len(step.rank_step_ms) == 2 and step.step_ms == max(step.rank_step_ms)
        assert result.strategy_report["data_parallel"]["world_size"] == 2
    assert rows["fsdp2"][0].strategy_report["data_parallel"]["blocks"] == 2
    assert "ddp x2" in rows["ddp"][0].label and "batch 8 (4/rank)" in rows["ddp"][0].label


@pytest.mark.gpu
def test_groups_on_the_gpus_train_like_one_gpu(worker):
    """NCCL, one rank per GPU: the same losses as one GPU on the global batch (fp32; looser
    than on the CPU, as GPU reductions reorder sums more), each rank's memory reported."""
    import torch

    n = min(2, torch.cuda.device_count())
    client = worker(device="cuda")
    results = {}
    for parallel in ("none", "ddp", "fsdp2"):
        config = TuneConfig.from_dict(
            {"parallel": parallel, "devices": 1 if parallel == "none" else n, "batch_size": 8})
        client.send(P.RunTrial(config, steps=3, warmup_steps=1, max_steps=3))
        done, _ = until(client, (P.TrialFinished, P.RunFailed))
        assert isinstance(done, P.TrialFinished) and done.result.status == "ok", done
        results[parallel] = done.result
    for parallel in ("ddp", "fsdp2"):
        result = results[parallel]
        for got, want in zip(result.losses, results["none"].losses, strict=True):
            assert math.isclose(got, want, rel_tol=1e-3), (parallel, result.losses)
        assert len(result.per_rank) == n
        assert all(r["peak_reserved_bytes"] > 0 for r in result.per_rank)
        assert result.mfu is not None and result.mfu > 0


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_a_killed_rank_ends_the_group_and_the_next_configuration_starts_a_new_one(gpt2_worker):
    client, _ = gpt2_worker
    client.send(P.ApplyConfig(TuneConfig.from_dict({"parallel": "ddp", "devices": 2}), measure_steps=1000))
    until(client, (P.StepMeasured,))
    until(client, (P.StepMeasured,))
    ranks = _ranks(client)
    assert len(ranks) == 2
    killed = time.monotonic()
    os.kill(ranks[1].pid, signal.SIGKILL)
    failed, _ = until(client, (P.RunFailed,), timeout=30)
    assert time.monotonic() - killed < 10
    assert failed.kind == "crash"
    assert "rank 1 died (killed by SIGKILL)" in failed.message
    gone, alive = psutil.wait_procs(ranks, timeout=5)
    assert not alive, "a rank of the failed group is still running"
    assert client.is_alive()

    client.send(P.ApplyConfig(TuneConfig.from_dict({"parallel": "ddp", "devices": 2}), measure_steps=2))
    done, _ = until(client, (P.TrialFinished, P.RunFailed))
    assert isinstance(done, P.TrialFinished) and done.result.status == "ok", done
    assert {p.pid for p in _ranks(client)}.isdisjoint({p.pid for p in ranks})


@pytest.mark.parametrize(
    "fault, kind, words",
    [
        ("rank:1:oom:2", "oom", "rank 1: out of memory"),
        ("rank:1:hang:3", "crash", "rank 1 hung: no answer to step 3 for"),
    ],
)
def test_a_rank_out_of_memory_or_hung_ends_the_group_and_says_which(worker, fault, kind, words):
    client = worker(fault_injection=fault)
    client.send(P.RunTrial(TuneConfig.from_dict({"parallel": "fsdp2", "devices": 2}), steps=6, warmup_steps=1))
    failed, _ = until(client, (P.RunFailed, P.TrialFinished), timeout=120)
    assert isinstance(failed, P.RunFailed) and failed.kind == kind, failed
    assert words in failed.message, failed.message
    assert failed.result is not None and failed.result.status == kind
    assert _ranks(client) == []  # the group was ended, nothing left behind
    assert client.is_alive()


@pytest.mark.slow
def test_bench_runs_an_fsdp2_group_in_bf16_and_reports_it(gputune, tmp_path):
    """`gputune bench --set devices=2` with an FSDP2 configuration in bf16 (FSDP2 gathers bf16
    parameters, and reduces gradients in bf16), run as a group and checked against one process.
    (A DDP row in bench took the same path, a group in a fresh worker, at the cost of a second
    group: DDP and FSDP2 as rows of a command, each checked against one process, are in
    test_tune_chooses_between_ddp_and_fsdp2_under_a_per_process_budget; each rank's figures
    of both, in test_ddp_and_fsdp2_give_the_loss_of_one_process_on_the_same_global_batch.)"""
    (tmp_path / "fsdp2.toml").write_text(
        "[config]\nparallel = 'fsdp2'\nprecision = 'bf16'\nattention = 'sdpa'\nfsdp_reduce = 'bf16'\n")
    out = tmp_path / "bench.json"
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--seq-len", "16",
                   "--config", str(tmp_path / "fsdp2.toml"),
                   "--set", "devices=2", "--steps", "2", "--warmup", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["status"], r["config"]["parallel"]) for r in rows] == [("ok", "fsdp2")]
    for row in rows:
        assert row["config"]["devices"] == 2 and row["batch_size"] == 8
        assert [r["rank"] for r in row["per_rank"]] == [0, 1]
        assert row["loss_ok"] is True  # against one process's fp32 run on the same batch
    assert rows[0]["strategy_report"]["data_parallel"]["param_dtype"] == "bfloat16"
    assert rows[0]["strategy_report"]["data_parallel"]["reduce_dtype"] == "bfloat16"
    assert "fp32 reference losses (batch 8)" in proc.stdout
    assert "global batch 8 = 2 x 4/rank" in proc.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "devices=2"], ["devices = 2 needs parallel = ddp or fsdp2"]),
        (["--set", "parallel=ddp", "--set", "devices=3", "--set", "batch_size=8"],
         ["batch_size = 8 is not a multiple of devices = 3"]),
        (["--set", "devices=0"], ["devices = 0 is out of range", ">= 1"]),
    ],
)
def test_bad_group_options_are_refused_in_one_line_before_any_worker(gputune, args, words):
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr
    assert "starting worker" not in proc.stdout


@pytest.mark.slow
def test_tune_chooses_between_ddp_and_fsdp2_under_a_per_process_budget(gputune, tmp_path):
    """`gputune tune --set devices=2 --search parallel=ddp,fsdp2` on gloo: both modes measured
    as groups against one process's fp32 reference, the sharding seen in each rank's memory, a
    recommendation with the budget per process, the global batch and why its mode won."""
    out, js = tmp_path / "best.toml", tmp_path / "tune.json"
    held = ["precision=fp32", "weights=fp32", "optimizer_state=fp32", "compile_mode=off",
            "attention=sdpa", "optimizer=plain", "checkpointing=off", "micro_batch_size=0",
            "fsdp_reshard=true", "ddp_bucket_mb=25", "fsdp_reduce=fp32", "batch_size=0"]
    proc = gputune("tune", "--device", "cpu", "--workload", "gpt2-tiny", "--seq-len", "16",
                   "--set", "devices=2",
                   "--search", "parallel=ddp,fsdp2", *[a for h in held for a in ("--set", h)],
                   "--steps", "2", "--warmup", "1", "--remeasure", "0", "--budget-minutes", "5",
                   "--max-memory", "4GiB", "--out", str(out), "--json", str(js))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "memory budget 4.00 GiB per process" in proc.stdout
    doc = json.loads(js.read_text())
    groups = {r["config"]["parallel"]: r for r in doc["results"] if r["config"]["devices"] == 2}
    assert set(groups) == {"ddp", "fsdp2"}
    for row in groups.values():
        assert row["status"] == "ok" and row["loss_ok"] is True, row
    # Each rank of FSDP2 holds about half the parameters a rank of DDP holds (padding aside),
    # as the estimate made before FSDP2 ran (from the runs before it) said.
    fsdp2, ddp = groups["fsdp2"], groups["ddp"]
    ratio = fsdp2["memory_parts"]["parameters"] / ddp["memory_parts"]["parameters"]
    assert 0.45 < ratio < 0.6, ratio
    estimated = fsdp2["memory_estimate"]
    assert estimated["parameters"] == pytest.approx(fsdp2["memory_parts"]["parameters"], rel=0.1)
    assert estimated["optimizer_state"] == 2 * estimated["parameters"]
    assert estimated["data_parallel"] == 0
    top = doc["recommendation"]
    assert top["config"]["devices"] == 2 and doc["memory_budget_per_device"] is True
    mode, other = top["config"]["parallel"], {"ddp": "fsdp2", "fsdp2": "ddp"}[
        top["config"]["parallel"]]
    assert f"{mode} x2 won: " in doc["reason"]
    assert f"at the same options {other} x2 " in doc["reason"]
    assert "global batch 8 = 4 per process x 1 accumulation step x 2 processes" in doc["reason"]
    assert "Memory budget: 4.00 GiB per process (each rank's peak counts against it; " \
           "2 processes)" in proc.stdout
    assert f"exported {top['label']}" in proc.stdout

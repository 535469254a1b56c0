"""Where the step's time goes: the analysis of profiler activities (recorded and hand-made
timelines), the profile through the real worker, and the search's use of the verdict."""

import json
import time

import pytest
from profile_recording import load

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import protocol as P
from tuner_tui.engine import workloads
from tuner_tui.engine.client import WorkerClient
from shared_runs import QUICK_BENCH, SHARED_GPT2_WORKER
from worker_events import until
from tuner_tui.engine.profile import (
    CATEGORIES, STEP_MARKER, Activity, categorize, describe, summarize, suggestions,
)
from tuner_tui.engine.protocol import TrialResult, WorkerSpec
from strategies.registry import OPTIONS
from tuner_tui.engine.search import AnytimeSearch, History, default_space
from tuner_tui.engine.search.priors import Context

GPU = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="NVIDIA H200")


def _sums_to_one(profile):
    assert set(profile["categories"]) == set(CATEGORIES)
    assert sum(profile["categories"].values()) == pytest.approx(1.0, abs=0.01)
    assert all(v >= 0 for v in profile["categories"].values())


# -- the categories --------------------------------------------------------------------------------


def test_categories_come_from_the_kernel_and_the_ops_that_launched_it():
    assert categorize(["aten::mm", "aten::matmul", "gputune.step#1"]) == "matmul"
    assert categorize(["aten::copy_", "aten::_to_copy", "aten::to", "aten::linear"]) == "copy"
    assert categorize(["aten::add_", "Optimizer.step#AdamW.step"]) == "optimizer"
    assert categorize(["aten::_log_softmax"]) == "elementwise"  # the loss, not attention
    assert categorize(["aten::_softmax", "aten::softmax"]) == "attention"
    assert categorize(["aten::bmm", "aten::_scaled_dot_product_efficient_attention"]) == "attention"
    assert categorize(["aten::native_layer_norm"]) == "elementwise"
    assert categorize([], "ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "communication"
    assert categorize(["aten::add"], "sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert categorize([], "Memcpy HtoD (Pageable -> Device)", kind="memcpy") == "copy"
    assert categorize([], "triton_poi_fused_add_gelu_0") == "elementwise"


# -- a recorded CPU profile ------------------------------------------------------------------------


def test_a_recorded_host_bound_cpu_profile_is_called_host():
    activities, facts = load()
    profile = summarize(activities, "cpu", measured_step_ms=facts["measured_step_ms"],
                        config=TuneConfig().to_dict())
    _sums_to_one(profile)
    assert profile["bottleneck"] == "host"
    assert profile["categories"]["idle"] >= 0.3
    assert profile["timeline"] == "CPU" and profile["steps"] == 1
    assert profile["launches_per_step"] > 1000  # 64 small modules: thousands of ops a step
    assert "ops per step" in profile["evidence"]
    assert any(s.startswith("compile_mode=default") for s in profile["suggestions"])
    assert not any("reduce-overhead" in s for s in profile["suggestions"])  # no CUDA graphs on a CPU
    assert len(profile["top_kernels"]) == 5
    assert profile["top_kernels"][0]["share"] >= profile["top_kernels"][-1]["share"]
    json.dumps(profile)  # plain data
    assert any(line.startswith("bottleneck: host") for line in describe(profile))


# -- hand-made GPU timelines -----------------------------------------------------------------------


class Timeline:
    """A GPU profile built by hand: step markers and launching ops on the host, kernels on a
    stream, linked as the profiler links them."""

    def __init__(self):
        self.activities = []
        self.next_id = 1

    def step(self, index, start, end):
        self.activities.append(Activity(f"{STEP_MARKER}{index}", "annotation", start, end, 1))

    def kernel(self, name, start, end, op="aten::add", op_at=None, flops=0.0, dtype="float",
               stream=7):
        at = op_at if op_at is not None else start - 1
        op_id = self.next_id
        self.next_id += 1
        self.activities += [
            Activity(op, "op", at, at + 0.5, 1, id=op_id, flops=flops, dtype=dtype),
            Activity("cudaLaunchKernel", "runtime", at + 0.1, at + 0.4, 1, link=op_id),
            Activity(name, "kernel", start, end, stream, link=op_id),
        ]


def test_gaps_between_kernels_are_idle_gpu_time_and_make_the_step_host_bound():
    t = Timeline()
    for s in range(3):  # each step: 10 kernels of 10 us, 40 us apart on the GPU
        base = s * 500
        t.step(s, base, base + 500)
        for k in range(10):
            start = base + 50 * k + 40
            t.kernel("elementwise_kernel", start, start + 10, op_at=base + 50 * k + 1)
    profile = summarize(t.activities, "cuda", config={"compile_mode": "off"})
    _sums_to_one(profile)
    # The window runs from the end of the lead-in step's last kernel to the end of the last.
    assert profile["steps"] == 2 and profile["step_ms"] == pytest.approx(0.5)
    assert profile["categories"]["idle"] == pytest.approx(0.8, abs=0.01)
    assert profile["bottleneck"] == "host"
    assert profile["launches_per_step"] == 10 and profile["kernels_per_step"] == 10
    assert profile["suggestions"][0].startswith("compile_mode=reduce-overhead")
    assert "GPU is idle 80%" in profile["evidence"]


def test_the_profilers_own_overhead_is_taken_out_of_the_idle_time():
    t = Timeline()
    for s in range(3):
        base = s * 500
        t.step(s, base, base + 500)
        for k in range(10):
            start = base + 50 * k + 40
            t.kernel("elementwise_kernel", start, start + 10, op_at=base + 50 * k + 1)
    # Unprofiled, the step took 0.25 ms: the other 0.25 ms of idle were the profiler's.
    profile = summarize(t.activities, "cuda", measured_step_ms=0.25)
    _sums_to_one(profile)
    assert profile["categories"]["idle"] == pytest.approx(0.6, abs=0.01)  # 150 of 250 us
    assert profile["measured_step_ms"] == 0.25 and profile["step_ms"] == pytest.approx(0.5)


def test_back_to_back_matmuls_are_compute_bound_at_their_rate_against_the_dtype_peak():
    t = Timeline()
    flops = 2 * 4096**3  # one 4096^3 matmul
    for s in range(3):
        base = s * 1000
        t.step(s, base, base + 1000)
        for k in range(4):  # 4 x 200 us of bf16 matmul, then 100 us of elementwise
            t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32", base + 200 * k, base + 200 * (k + 1),
                     op="aten::mm", op_at=base + k, flops=flops, dtype="c10::BFloat16")
        t.kernel("vectorized_elementwise_kernel", base + 800, base + 1000, op_at=base + 5)
    peaks = {"bf16": (989.4, "datasheet: NVIDIA H200 bf16 dense")}
    profile = summarize(t.activities, "cuda", peaks=peaks, config={"precision": "bf16"})
    _sums_to_one(profile)
    assert profile["categories"]["matmul"] == pytest.approx(0.8)
    assert profile["categories"]["idle"] == pytest.approx(0.0, abs=1e-9)
    assert profile["bottleneck"] == "compute"
    rate = profile["matmul"][0]
    assert rate["precision"] == "bf16"
    assert rate["tflops"] == pytest.approx(flops / 200e-6 / 1e12)
    assert rate["of_peak"] == pytest.approx(rate["tflops"] / 989.4)
    assert "of the bf16 peak" in profile["evidence"]
    assert not any(s.startswith("precision=bf16") for s in profile["suggestions"])
    assert rate["flops_per_step"] == 4 * flops and rate["ms_per_step"] == pytest.approx(0.8)
    assert "matmul: 687.2 TFLOP/s bf16 = 69% of peak" in describe(profile)


def test_attention_counts_the_kernels_of_its_inner_ops_and_graph_replays_have_no_rate():
    t = Timeline()
    flops = 2 * 8 * 16 * 1024 * 1024 * 128 * 2  # B=8, H=16, L=1024, E=Ev=128: two matmuls
    for s in range(3):
        base = s * 1000
        t.step(s, base, base + 1000)
        # The flash op carries the FLOPs; its inner op launches the kernel.
        outer = Activity("aten::_scaled_dot_product_flash_attention", "op", base + 1, base + 4, 1,
                         id=1000 + s, flops=flops, dtype="c10::BFloat16")
        t.activities.append(outer)
        # A gemm with no op: as CUDA graphs replay it.
        t.activities.append(Activity("sm90_xmma_gemm_bf16bf16", "kernel", base + 100, base + 400, 7))
        t.kernel("flash_fwd_kernel", base + 400, base + 900,
                 op="aten::_flash_attention_forward", op_at=base + 2)
    peaks = {"bf16": (989.4, "datasheet")}
    profile = summarize(t.activities, "cuda", peaks=peaks)
    (sdpa,) = profile["sdpa"]
    assert sdpa["tflops"] == pytest.approx(flops / 500e-6 / 1e12)
    assert 0 < sdpa["of_peak"] < 1 and sdpa["flops_per_step"] == flops
    assert profile["matmul"] == [] and profile["categories"]["matmul"] == pytest.approx(0.3)
    line = [x for x in describe(profile) if x.startswith("matmul: ")]
    assert line == [("matmul: TFLOP/s unknown (its kernels ran without a matmul op to count); "
                     f"SDPA: {sdpa['tflops']:.1f} TFLOP/s bf16 = {sdpa['of_peak']:.0%} of peak")]


def test_elementwise_heavy_steps_are_memory_bound():
    t = Timeline()
    for s in range(3):
        base = s * 1000
        t.step(s, base, base + 1000)
        t.kernel("gemm", base, base + 300, op="aten::mm", op_at=base)
        t.kernel("layer_norm_kernel", base + 300, base + 1000, op="aten::native_layer_norm",
                 op_at=base + 1)
    profile = summarize(t.activities, "cuda", config={})
    assert profile["bottleneck"] == "memory"
    assert profile["categories"]["elementwise"] == pytest.approx(0.7)
    assert any(s.startswith("fused_kernels") for s in profile["suggestions"])


def test_only_collectives_not_hidden_behind_compute_count_as_communication():
    def profile_with(overlapped):
        t = Timeline()
        for s in range(3):
            base = s * 1000
            t.step(s, base, base + 1000)
            t.kernel("gemm", base, base + 600, op="aten::mm", op_at=base)
            start = base + (200 if overlapped else 600)
            t.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", start, start + 400,
                     op="c10d::allreduce_", op_at=base + 2, stream=9)
        return summarize(t.activities, "cuda")

    exposed, hidden = profile_with(False), profile_with(True)
    _sums_to_one(exposed)
    _sums_to_one(hidden)
    assert exposed["categories"]["communication"] == pytest.approx(0.4)
    assert exposed["bottleneck"] == "communication"
    assert hidden["categories"]["communication"] == pytest.approx(0.0)
    assert hidden["categories"]["idle"] == pytest.approx(0.4)


def test_a_profile_needs_a_lead_in_and_a_measured_step():
    t = Timeline()
    t.step(0, 0, 10)
    with pytest.raises(ValueError, match="at least two marked steps"):
        summarize(t.activities, "cuda")


def test_suggestions_leave_out_what_the_configuration_already_does():
    done = {"compile_mode": "reduce-overhead", "optimizer": "fused"}
    assert suggestions("host", done) == ["a larger micro-batch (batch_size): more work per launch"]
    assert any("precision=bf16" in s for s in suggestions("compute", {"precision": "fp32"}))
    assert not any("precision" in s for s in suggestions("compute", {"precision": "bf16"}))
    on_cpu = suggestions("memory", {}, gpu=False)  # no Triton kernels without CUDA
    assert on_cpu and not any(s.startswith("fused_kernels") for s in on_cpu)


# -- the search follows the verdict ----------------------------------------------------------------


def _measured(config, tokens, bottleneck=None):
    profile = {"bottleneck": bottleneck} if bottleneck else {}
    return TrialResult(config=config.to_dict(), label=config.label(), status="ok",
                       tokens_per_s=tokens, loss_ok=True, profile=profile)


def _next_after(bottleneck):
    """The move proposed after the baseline and an incumbent profiled with `bottleneck`."""
    space = default_space(GPU, 16, fixed={"batch_size": 16})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16))
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    expert = strategy.next(history).config
    history.add(expert, _measured(expert, 450e3, bottleneck))
    return strategy.next(history)


def test_moves_that_address_the_bottleneck_weigh_more():
    plain = _next_after(None)
    for bottleneck in ("host", "memory", "compute"):
        weighed = _next_after(bottleneck)
        addresses = any(bottleneck in OPTIONS[k].search.addresses for k in weighed.keys)
        if weighed.config == plain.config:
            assert weighed.score == pytest.approx(plain.score * (1.5 if addresses else 1.0))
        else:  # another move overtook it: one that addresses the bottleneck
            assert addresses


def test_tune_profile_measures_again_a_stored_row_without_a_profile(tmp_path, monkeypatch):
    import io

    from tuner_tui.engine import runner
    from tuner_tui.engine.search import Search, SearchPlan
    from tuner_tui.engine.store import ResultStore

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    sent = []

    from tuner_tui.engine.search.executor import WorkerExecutor

    class Counting(WorkerExecutor):
        def run(self, config, plan, *args):
            sent.append(plan.profile_steps)
            return super().run(config, plan, *args)

    fixed = {"precision": "fp32", "compile_mode": "off", "attention": "manual",
             "checkpointing": "off", "optimizer": "plain", "fused_kernels": (), "batch_size": 0,
             "weights": "fp32", "optimizer_state": "fp32", "fp8": "off", "micro_batch_size": 0}
    store = ResultStore(tmp_path / "results.sqlite3")

    def tune(profile_steps):
        spec = WorkerSpec(workload="gpt2-tiny", device="cpu")
        plan = SearchPlan(spec, steps=2, warmup_steps=1, fixed=fixed, profile_steps=profile_steps)
        return Search(plan, store, out=io.StringIO(), executor=Counting(spec)).run()

    assert not tune(0).results[0].profile
    profiled = tune(2)
    assert sent == [0, 2]  # the stored row had no profile: measured again, with one
    assert profiled.results[0].profile["bottleneck"] in ("host", "memory", "compute")
    assert tune(2).reused == 1 and sent == [0, 2]  # now stored with its profile
    store.close()


# -- through the real worker ----------------------------------------------------------------------


def _trial(workload, tmp_path=None, config=None, **trial):
    client = WorkerClient(WorkerSpec(workload=workload, device="cpu"))
    client.start()
    try:
        deadline = time.monotonic() + 300
        client.send(P.RunTrial(config or TuneConfig.from_dict({}), **trial))
        while time.monotonic() < deadline:
            event = client.wait_event(1.0)
            if isinstance(event, (P.TrialFinished, P.RunFailed)):
                return event
            assert client.is_alive()
        raise AssertionError("no result within 300 s")
    finally:
        client.stop()


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_the_profile_of_gpt2_tiny_comes_back_through_the_worker_with_its_trace(tmp_path,
                                                                               gpt2_worker):
    trace = tmp_path / "traces" / "gpt2-tiny.json"
    client, _ = gpt2_worker
    client.send(P.RunTrial(TuneConfig.from_dict({}), steps=3, warmup_steps=2, max_steps=3,
                           profile_steps=2, trace_path=str(trace)))
    done, _ = until(client, (P.TrialFinished, P.RunFailed), timeout=300)
    assert isinstance(done, P.TrialFinished)
    result = done.result
    assert result.status == "ok" and result.measured_steps == 3  # profiled steps not measured
    profile = result.profile
    _sums_to_one(profile)
    assert profile["bottleneck"] in ("host", "memory", "compute", "communication")
    assert profile["steps"] == 2 and profile["device"] == "cpu"
    (matmul,) = profile["matmul"]
    assert matmul["precision"] == "fp32" and matmul["tflops"] > 0
    assert matmul["peak_tflops"] is None and matmul["of_peak"] is None  # no trustworthy CPU peak
    # The FLOPs counted from the shapes are the model's: 6 per weight per token (the LayerNorm
    # weights and biases, no matmul, are the difference) and attention's two matmuls.
    workload = workloads.load("gpt2-tiny", None, 0, None, "cpu")
    model_flops = workload.flops_per_item(workload.build_model())
    tokens = result.batch_size * result.sequence_length
    assert matmul["flops_per_step"] == pytest.approx(model_flops * tokens, rel=0.03)
    assert matmul["profiler_flops_per_step"] == pytest.approx(matmul["flops_per_step"])
    assert profile["compile"] == {"graphs": 0, "graph_breaks": 0, "recompiles": 0}
    assert profile["trace"] == str(trace)
    assert "traceEvents" in json.loads(trace.read_text())
    # Plain data across the protocol, and back from JSON (bench --json, the store).
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))).profile == profile


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_the_live_run_is_profiled_after_its_measurement_window(gpt2_worker):
    client, _ = gpt2_worker
    client.send(P.ProfileRun(steps=2))  # before any run: it waits for the next one
    client.send(P.ApplyConfig(TuneConfig.from_dict({}), measure_steps=3))
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(isinstance(e, P.ProfileMeasured) for e in seen):
        event = client.wait_event(1.0)
        if event is not None:
            seen.append(event)
        assert client.is_alive()
    kinds = [type(e).__name__ for e in seen]
    assert "no run is training" in next(e.text for e in seen if isinstance(e, P.WorkerLog))
    assert kinds.index("TrialFinished") < kinds.index("ProfileMeasured")
    done = next(e for e in seen if isinstance(e, P.ProfileMeasured))
    run = next(e for e in seen if isinstance(e, P.RunStarted))
    assert done.run_id == run.run_id and done.profile["steps"] == 2
    _sums_to_one(done.profile)


def test_many_tiny_ops_are_host_bound_through_the_worker():
    done = _trial("user_workloads:many_tiny_ops", steps=3, warmup_steps=2, profile_steps=3)
    profile = done.result.profile
    _sums_to_one(profile)
    assert profile["bottleneck"] == "host", profile["evidence"]


# -- the commands ----------------------------------------------------------------------------------


@pytest.mark.xdist_group(QUICK_BENCH)
def test_bench_profile_writes_categories_and_bottleneck_for_each_row(quick_bench):
    # `bench --preset quick --profile --steps 3 --warmup 2` (conftest.py; on a text file, for
    # test_bench_cli.py's test of --data)
    proc, out = quick_bench
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 2
    for row in rows:
        assert row["status"] == "ok"
        assert sum(row["profile"]["categories"].values()) == pytest.approx(1.0, abs=0.01)
        assert row["profile"]["bottleneck"] in ("host", "memory", "compute", "communication")
    assert proc.stdout.count("bottleneck: ") == 2 and "#2 bf16 + sdpa" in proc.stdout
    assert rows[1]["profile"]["matmul"][0]["precision"] == "bf16"
    assert rows[1]["profile"]["sdpa"][0]["tflops"] > 0
    assert proc.stdout.count("matmul: ") == 2 and "bf16; SDPA: " in proc.stdout
    assert "bf16 (no peak on the CPU)" in proc.stdout
    assert "USDT" not in proc.stderr  # the profiler's own chatter stays off the terminal


def test_trace_must_name_a_folder(gputune, tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    for command in ("bench", "tune"):
        proc = gputune(command, "--device", "cpu", "--workload", "gpt2-tiny", "--trace", str(taken))
        assert proc.returncode == 2
        assert proc.stderr.strip() == f"gputune: --trace {taken} is a file: a folder is wanted"


@pytest.mark.gpu
def test_a_gpu_profile_splits_the_gpu_timeline_and_rates_the_matmuls():
    import torch

    from tuner_tui.engine import workloads
    from tuner_tui.engine.profiler import profile_trainer
    from tuner_tui.engine.trial import Trainer

    config = TuneConfig().replace(precision="bf16", attention="sdpa")
    trainer = Trainer(workloads.load("gpt2-tiny", None, 0, None, "cuda"), config, "cuda",
                      warmup_steps=3, device_name=torch.cuda.get_device_name())
    trainer.build()
    for _ in range(6):
        trainer.step()
    trainer.finish()
    measured = trainer.result()
    profile = profile_trainer(trainer, measured_step_ms=measured.step_ms)
    _sums_to_one(profile)
    assert profile["timeline"] == "GPU" and profile["kernels_per_step"] > 10
    assert profile["launches_per_step"] > 10
    assert profile["bottleneck"] == "host"  # a tiny model: the GPU waits for launches
    bf16 = next(r for r in profile["matmul"] if r["precision"] == "bf16")
    assert bf16["tflops"] > 0 and 0 < bf16["of_peak"] < 1
    assert profile["sdpa"] and 0 < profile["sdpa"][0]["of_peak"] < 1
    # Counted from the shapes, the GEMMs and SDPA cover the model's FLOPs (causal SDPA: half
    # of attention's).
    counted = sum(r["flops_per_step"] for r in profile["matmul"] + profile["sdpa"])
    model = trainer.workload.flops_per_item(trainer.tuned.model) * trainer.items_per_step()
    assert 0.85 < counted / model < 1.05
    assert len(trainer.records) == len(measured.losses)  # the profiled steps left no records
    trainer.close()


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_a_group_is_profiled_in_its_ranks_where_it_trains(group_trials):
    """With devices > 1 the worker only drives the ranks: the profile must be theirs (the
    worker's own timeline would be empty, all idle, and read as host-bound)."""
    # The DDP trial of test_group.py's (conftest.py: ddp x2, batch 8, 2 steps profiled after
    # its measured ones, the traces asked for in traces/ddp.json).
    trace = group_trials["trace"]
    result, _ = group_trials["ddp"]
    profile = result.profile
    _sums_to_one(profile)
    (matmul,) = profile["matmul"]
    assert matmul["tflops"] > 0 and profile["launches_per_step"] > 100
    assert [r["rank"] for r in profile["ranks"]] == [0, 1]
    assert all(r["bottleneck"] for r in profile["ranks"])
    # gloo's all-reduce is in each rank's timeline (as NCCL's kernels are on a GPU)
    assert all(r["communication"] > 0 for r in profile["ranks"])
    from tuner_tui.engine.profile import describe

    (line,) = [ln for ln in describe(profile) if ln.startswith("ranks: ")]
    assert line.startswith("ranks: 0 ") and "; 1 " in line and "communication" in line
    assert sorted(p.name for p in trace.parent.iterdir()) == ["ddp-rank0.json", "ddp-rank1.json"]

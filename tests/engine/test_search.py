"""`gputune tune`: the space, the memory estimate, and searches on the CPU with real workers, for
the wiring (no compile but once: a compiled trial costs ~30 s on the CPU). The strategy's parts
are tested in test_search_strategy.py, the search's logic by simulation in
test_search_simulated.py."""

import dataclasses
import io
import json
import subprocess
import sys

import pytest

from strategies import load
from strategies.config import ConfigError, TuneConfig
from tuner_tui.engine import search
from tuner_tui.engine.noise import simplest
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search import (
    Search, SearchPlan, default_space, estimate_peak,
    parse_bytes, parse_choices, pareto_front,
)
from tuner_tui.engine.search.executor import WorkerExecutor
from tuner_tui.engine.search.report import tied_leaders
from tuner_tui.engine.store import ResultStore
from search_cases import CPU, GPU, MEMORY_LEVERS_HELD, MiB, row_of
from shared_runs import SHARED_GPT2_WORKER


# -- pure parts -----------------------------------------------------------------------------------


def test_the_parent_side_imports_no_torch():
    code = ("import sys, tuner_tui.engine.search, tuner_tui.engine.store; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parse_bytes_and_choices():
    assert parse_bytes("40GiB") == 40 * 2**30
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("512 mib") == 512 * MiB and parse_bytes("123") == 123
    for bad in ("lots", "40 GiBs", "-1G", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    assert parse_choices("fused_kernels", "none,gelu+layer_norm") == ((), ("layer_norm", "gelu"))
    assert parse_choices("batch_size", "x1,x2,64") == ("x1", "x2", 64)
    with pytest.raises(ConfigError, match="precision = 'fp64' is not allowed"):
        parse_choices("precision", "fp32,fp64")
    with pytest.raises(ConfigError, match="unknown option 'precison'"):
        parse_choices("precison", "fp32")


def test_the_space_holds_only_what_the_machine_can_run():
    space = default_space(CPU, default_batch=8)
    values = dict(space.choices)
    assert values["precision"] == ("fp32", "bf16")  # tf32 and fp16 need CUDA
    assert values["compile_mode"] == ("off", "default")  # reduce-overhead needs CUDA
    assert "fused_kernels" not in values  # Triton needs a GPU: held at none
    # The batch: the workload's and its multiples, climbing on while a doubling pays (the
    # expert writes the largest that fits); `--set batch_size=N` holds it.
    assert values["batch_size"] == (0, 16, 32) and default_space(CPU, 8).grow_batch
    assert "batch_size" not in dict(default_space(CPU, 8, fixed={"batch_size": 8}).choices)
    assert values["weights"] == ("fp32", "bf16")
    assert values["optimizer_state"] == ("fp32", "bf16", "8bit")  # offload needs CUDA
    assert "fp8" not in values  # float8 needs compute capability 8.9
    asked = dict(default_space(CPU, 8, choices={"batch_size": ("x1", "x2")}).choices)
    assert asked["batch_size"] == (0, 16)  # x1 is the default, written 0
    gpu = dict(default_space(GPU, 16, fixed={"optimizer": "fused"}).choices)
    assert gpu["precision"] == ("fp32", "tf32", "bf16", "fp16") and "optimizer" not in gpu
    assert gpu["fp8"] == ("off", "tensorwise", "rowwise")
    assert len(gpu["fused_kernels"]) == 3
    start = default_space(GPU, 16, fixed={"optimizer": "fused"}).start()
    assert start.changed() == {"optimizer": "fused"}


def test_a_choice_that_changes_nothing_in_the_model_is_not_searched_unless_asked_for():
    skip = {"compile_scope=block": "the repeated blocks come in 8 shapes"}
    assert dict(default_space(GPU, 64).choices)["compile_scope"] == ("model", "block")
    space = default_space(GPU, 64, inapplicable=skip)
    assert "compile_scope" not in dict(space.choices)
    assert "compile_scope" not in space.describe() and dict(space.fixed)["compile_scope"] == "model"
    asked = default_space(GPU, 64, choices={"compile_scope": ("model", "block")}, inapplicable=skip)
    assert dict(asked.choices)["compile_scope"] == ("model", "block")  # (both run as model)


def test_memory_estimate_scales_with_batch_and_measured_checkpointing_ratio():
    measured = [row_of(100.0, 800 * MiB, precision="bf16"),  # batch 8 (the default)
                row_of(90.0, 400 * MiB, precision="bf16", checkpointing="full"),
                row_of(50.0, 900 * MiB)]
    bf16 = TuneConfig.from_dict({"precision": "bf16"})
    assert estimate_peak(bf16.replace(batch_size=32), measured, 8) == 3200 * MiB
    # full checkpointing measured at half the peak per sample: batch 32 needs half as much
    full32 = bf16.replace(batch_size=32, checkpointing="full")
    assert estimate_peak(full32, measured, 8) == 1600 * MiB
    # an unmeasured mode is assumed to save nothing
    selective16 = bf16.replace(batch_size=16, checkpointing="selective")
    assert estimate_peak(selective16, measured, 8) == 1600 * MiB
    # the nearest configuration is the one with the fewest other options changed
    assert estimate_peak(TuneConfig.from_dict({"batch_size": 16}), measured, 8) == 1800 * MiB
    assert estimate_peak(bf16, [], 8) is None


def test_pareto_front_keeps_trials_no_other_beats_on_both():
    rows = [row_of(100.0, 8 * MiB, precision="bf16"),
            row_of(90.0, 4 * MiB, precision="bf16", checkpointing="full"),
            row_of(80.0, 6 * MiB), row_of(95.0, 9 * MiB, optimizer="fused")]
    assert [r.tokens_per_s for r in pareto_front(rows)] == [100.0, 90.0]


@pytest.mark.parametrize("device, exits, status", [
    ("cpu", (-9, -9), "oom"),  # the host's memory is the model's: the OOM killer's SIGKILL
    ("cpu", (-9, -11), "crash"),  # a segfault the second time is not memory
    ("cuda", (-9, -9), "crash"),  # the host's memory is not the device's
    ("cpu", (-9, None), "ok"),  # a kill that did not happen again
])
def test_a_worker_killed_twice_on_the_cpu_is_out_of_memory(device, exits, status):
    from tuner_tui.engine.runner import died

    class Scripted(WorkerExecutor):  # each try's end as a worker would give it, no process
        def __init__(self, spec):
            super().__init__(spec)
            self.tries = list(exits)

        def _once(self, config, *args):
            code = self.tries.pop(0)
            return TrialResult(config=config.to_dict(), label="fp32",
                               **({"status": "ok", "tokens_per_s": 1.0} if code is None else
                                  {"status": "crash", "message": died(code)}))

    from tuner_tui.engine.progress import Progress

    executor = Scripted(WorkerSpec(workload="gpt2-tiny", device=device))
    result = executor.run(TuneConfig.from_dict({}), None, (), Progress(io.StringIO()), None, None)
    assert result.status == status and not executor.tries
    if status == "oom":
        assert result.message.endswith("(twice: in a fresh worker too); counted as out of the "
                                       "host's memory"), result.message


# -- searches with real workers -------------------------------------------------------------------


class CountingExecutor(WorkerExecutor):
    """The real executor (fresh workers), counting the configurations really sent to one."""

    def __init__(self, spec):
        super().__init__(spec)
        self.sent: list[dict] = []
        self.steps: list[int] = []

    def run(self, config, plan, *args):
        self.sent.append(config.to_dict())
        self.steps.append(plan.steps)
        return super().run(config, plan, *args)


def hold_off_second_runs(monkeypatch):
    """A CPU shared with other tests slows a trial at random: the search would run it once more
    (surprise.SURPRISE_SDS, tested on simulated disturbances in test_search_simulated.py), and
    the trials these tests count would change with the host's load."""
    from tuner_tui.engine.search import surprise

    monkeypatch.setattr(surprise, "SURPRISE_SDS", float("inf"))
    monkeypatch.setattr(surprise, "ABOVE_SDS", float("inf"))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    hold_off_second_runs(monkeypatch)
    return tmp_path / "home"


def _search(store, **plan):
    """A search on the CPU with real workers; (outcome, its printed log, the executor)."""
    spec = WorkerSpec(workload=plan.pop("workload", "gpt2-tiny"), device="cpu",
                      fault_injection=plan.pop("fault", None),
                      environ=tuple(search.compile_cache_environ().items()))
    # Fused kernels are held off: tests run Triton's interpreter (TRITON_INTERPRET=1), slowly.
    fixed = {"compile_mode": "off", "attention": "manual", "checkpointing": "off",
             "optimizer": "plain", "fused_kernels": (), "batch_size": 0, **MEMORY_LEVERS_HELD}
    fixed = {k: v for k, v in fixed.items() if k not in plan.get("choices", {})}
    # The leaders' interleaved re-measurement is off unless a test asks (test_noise.py does).
    plan = SearchPlan(spec, steps=plan.pop("steps", 2), warmup_steps=1,
                      fixed={**fixed, **plan.pop("fixed", {})},
                      remeasure_repeats=plan.pop("remeasure_repeats", 0), **plan)
    out = io.StringIO()
    executor = CountingExecutor(spec)
    outcome = Search(plan, store, out=out, executor=executor).run()
    return outcome, out.getvalue(), executor


def test_a_workload_whose_own_code_fails_is_run_once_a_configuration_and_named(home):
    """Every parameter frozen, an MLP's backward fails in every configuration. Its fp32
    reference ("fp32 + sdpa": SDPA changes nothing in an MLP) is its baseline, not run again;
    the rows speak of its samples, and the reason names the workload's error."""
    from tuner_tui.engine.search.report import report

    store = ResultStore(home / "results.sqlite3")
    outcome, _, executor = _search(store, workload="tests.engine.user_workloads:frozen_mlp",
                                   choices={"precision": ("fp32", "bf16")})
    store.close()
    labels = [r.label for r in outcome.results]
    assert labels[0] == "fp32" and len(set(labels)) == len(labels), labels
    assert all(c.get("attention", "manual") == "manual" for c in executor.sent), executor.sent
    assert all(r.status == "crash" for r in outcome.results)
    assert outcome.recommendation is None
    assert "the fp32 eager baseline" in outcome.reason
    assert "does not require grad" in outcome.reason, outcome.reason
    header = next(ln for ln in report(outcome).splitlines() if ln.startswith("#"))
    assert "samples/s" in header, header


def test_a_compared_file_without_a_batch_trains_at_the_runs_batch(home):
    """Seen on the H200: `tune --set batch_size=4 --compare lever.toml` measured the levers at
    the workload's default batch (2), beside a search at 4, and called them slower."""
    store = ResultStore(home / "results.sqlite3")
    silent = TuneConfig.from_dict({"precision": "fp32", "optimizer": "foreach"})
    named = TuneConfig.from_dict({"precision": "fp32", "optimizer": "foreach", "batch_size": 1})
    outcome, _, _ = _search(store, compare=[silent, named], choices={"precision": ("fp32",)},
                            fixed={"batch_size": 3})
    store.close()
    assert [r.batch_size for r in outcome.compared] == [3, 1]
    assert [r.config["batch_size"] for r in outcome.compared] == [3, 1]


def test_the_first_candidate_is_estimated_from_the_reference_run_before_it(home):
    """Seen on the H200: the fp32 reference at the run's batch ran first, for its losses, and
    the search's first candidate, estimated before it, had no memory estimate at all."""
    store = ResultStore(home / "results.sqlite3")
    # (one optimizer: the first candidate, the bf16 baseline, is the one looked at)
    outcome, _, _ = _search(store, choices={"optimizer": ("plain",)},
                            fixed={"precision": "bf16", "batch_size": 3})
    store.close()
    first, *_ = [r for r in outcome.results if r.config["precision"] == "bf16"]
    assert first.memory_estimate is not None and first.memory_estimate["total"] > 0


def test_search_ranks_and_reuses_the_store(home):
    store = ResultStore(home / "results.sqlite3")
    outcome, log, executor = _search(store, choices={"precision": ("fp32", "bf16")})
    labels = [r.label for r in outcome.results]
    assert labels == ["fp32", "bf16"]  # the baseline, then the one move there is
    assert outcome.timeline[0]["why"] == "the fp32 eager baseline"
    assert outcome.ran == 2 and len(store) == 2 and len(executor.sent) == 2
    # Ranked: eligible trials by throughput, then the rest; the winner kept the loss.
    ok = [r for r in outcome.ranked if r.status == "ok"]
    assert ok == sorted(ok, key=lambda r: -r.tokens_per_s)
    # (the CPU's timings may tie the two: then the simpler is recommended, and the reason says so)
    tied = tied_leaders(ok)
    assert outcome.recommendation is (ok[0] if len(tied) == 1 else simplest(tied))
    assert outcome.recommendation.loss_ok is not False
    assert outcome.front and outcome.front[0] is ok[0]
    assert ("fastest of 2 configurations" if len(tied) == 1 else
            "the simplest of 2 configurations tied at the top") in outcome.reason
    assert "[1/" in log and "best " in log and "the fp32 eager baseline" in log

    # Again, on the same store: nothing is measured twice. (What the first search measured also
    # taught the priors: a move it found slower may not be proposed again.)
    outcome2, log2, again = _search(store, choices={"precision": ("fp32", "bf16")})
    assert again.sent == [] and outcome2.ran == 0
    assert outcome2.reused >= 1 and log2.count("skipped as measured") == outcome2.reused
    first = {r.label: r.tokens_per_s for r in outcome.results}
    assert all(first[r.label] == r.tokens_per_s for r in outcome2.results)
    path = search.export(outcome, home / "gputune.toml")
    assert load(path).to_dict() == outcome.recommendation.config
    store.close()


def test_an_oom_is_recorded_and_the_search_goes_on(home):
    store = ResultStore(home / "results.sqlite3")
    outcome, log, executor = _search(
        store, fault="oom-above:8", max_memory_bytes=2**40,
        choices={"batch_size": ("x1", "x2"), "optimizer": ("plain", "foreach")},
        fixed={"precision": "fp32"})
    statuses = [(r.config["batch_size"], r.status) for r in outcome.results]
    # The expert's recipe takes the larger batch, which runs out of memory: recorded, and the
    # search goes on at the batch that fits, never sending a configuration that did not fit
    # again. (Whether the other optimizer at batch 16 is tried depends on the CPU peaks the
    # estimates scale from, which a busy host moves: test_fit.py has the rule itself.)
    assert statuses[0] == (0, "ok") and (16, "oom") in statuses
    sent = [json.dumps(c, sort_keys=True) for c in executor.sent]
    assert len(sent) == len(set(sent))
    assert all(status == "oom" for batch, status in statuses if batch == 16)
    assert "out of memory" in log
    assert outcome.recommendation is not None and outcome.recommendation.batch_size == 8
    stored = {(s.config["batch_size"], s.result.status) for s in store.past()}
    assert (16, "oom") in stored
    store.close()


def test_the_one_compiled_trial_uses_the_shared_inductor_cache_and_records_compile_time(
    home, monkeypatch
):
    # torch sets TORCHINDUCTOR_CACHE_DIR in os.environ once anything compiles in this process
    # (another test may have); the gputune parent never imports torch.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    store = ResultStore(home / "results.sqlite3")
    fixed = {"compile_mode": "default", "compile_scope": "model", "precision": "fp32",
             "batch_size": 0}
    # A small MLP: what is checked is the cache and the compile time, not the model (a CPU
    # compile of it takes a few seconds, of gpt2-tiny twenty).
    outcome, log, _ = _search(store, fixed=fixed, max_memory_bytes=2**40,
                              workload="tests.engine.user_workloads:tiny_mlp")
    # The fp32 eager reference runs first (the losses to check against), then the compiled one.
    # It is the reference bench and the worker use, TuneConfig.reference, but with SDPA, which
    # an MLP has no use for, at its default: the one run it is for this model.
    eager, compiled = outcome.results
    assert eager.config == TuneConfig.reference().replace(attention="manual").to_dict()
    assert eager.label == "fp32"
    assert compiled.label == "fp32 + compile(default)"
    assert compiled.status == "ok" and compiled.loss_ok is True
    assert compiled.compile_s > eager.compile_s
    assert outcome.recommendation is compiled  # the eager reference lies outside the space
    stored = store.lookup(outcome.workload_key, compiled.config, 2, 1, outcome.environment)
    assert stored.result.compile_s == compiled.compile_s
    assert any((home / "inductor").rglob("*")), "the worker did not use the shared cache"
    store.close()


@pytest.mark.xdist_group(SHARED_GPT2_WORKER)
def test_a_trial_clearly_slower_than_the_best_is_stopped_early(gpt2_worker):
    from tuner_tui.engine.protocol import RunTrial, RunFailed, TrialFinished

    client, _ = gpt2_worker  # a real gpt2-tiny worker, shared with other tests (conftest.py)
    client.send(RunTrial(TuneConfig.from_dict({}), steps=8, warmup_steps=1, stop_if_slower_than_ms=1e-3))
    event = client.wait_event(120)
    while not isinstance(event, (TrialFinished, RunFailed)):
        event = client.wait_event(120)
    result = event.result
    # Stopped once 3 steps were measured; the steps already queued (the host runs ahead) count.
    assert result.status == "stopped" and 3 <= result.measured_steps < 8
    assert "clearly slower" in result.message and result.tokens_per_s > 0
    assert "stop line 0.0 ms (the best's throughput at this batch" in result.message


def test_tune_command_end_to_end(gputune, home, tmp_path):
    out, js = tmp_path / "best.toml", tmp_path / "tune.json"
    # The configuration "I train with now", measured in the same run as the search.
    current = tmp_path / "current.toml"
    current.write_text('[config]\noptimizer = "foreach"\n')
    args = ["tune", "--device", "cpu", "--workload", "gpt2-tiny", "--seq-len", "16",
            "--steps", "2", "--warmup", "1",
            "--compare", str(current),
            "--search", "precision=fp32,bf16", "--set", "compile_mode=off",
            "--set", "checkpointing=off", "--set", "batch_size=0", "--set", "optimizer=plain",
            "--set", "attention=manual", "--set", "fused_kernels=",
            "--set", "weights=fp32", "--set", "optimizer_state=fp32", "--set", "micro_batch_size=0",
            "--out", str(out), "--json", str(js), "--format", "hf",
            "--store", str(tmp_path / "s.sqlite3"), "--max-memory", "8GiB",
            # (the leaders' re-measurement in fresh workers: test_noise.py)
            "--remeasure", "0"]
    proc = gputune(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Pareto front" in proc.stdout and "Recommended:" in proc.stdout
    doc = json.loads(js.read_text())
    assert doc["tool"] == "gputune tune" and len(doc["results"]) == 3
    [compared] = doc["compared"]
    assert compared["label"] == "fp32 + foreach AdamW" and compared["status"] == "ok"
    assert compared["recommendation_speedup"] == pytest.approx(
        doc["recommendation"]["tokens_per_s"] / compared["tokens_per_s"])
    assert "fp32 + foreach AdamW (--compare, same run)" in doc["reason"]
    assert doc["memory_budget_bytes"] == 8 * 2**30
    # When the first worker was ready, before the first trial, and what its start took
    startup = doc["startup"]
    assert 0 < startup["ready_s"] <= doc["timeline"][0]["started_s"]
    assert startup["torch"] > 0 and "first batch" in startup
    parts = [v for k, v in startup.items() if k != "ready_s" and v is not None]
    assert sum(parts) <= startup["ready_s"] + 0.05  # the worker started after the search did
    assert f"the first worker was ready after {startup['ready_s']:.1f} s (python " in proc.stdout
    # Where each run's time went in its worker, and all runs' together in the report
    ran = [e for e in doc["timeline"] if e["how"] == "ran"]
    for event in ran:
        assert sum(event["phases_s"].values()) <= event["ended_s"] - event["started_s"] + 0.05
        assert "first step" in event["phases_s"] and "measured" in event["phases_s"]
    assert f"Where the runs' time went ({len(ran)} runs, " in proc.stdout
    import tomllib

    exported = tomllib.loads(out.read_text())
    assert exported["measured"]["reason"].startswith(
        ("fastest of 2 configurations", "the simplest of 2 configurations tied at the top"))
    assert exported["config"] == doc["recommendation"]["config"]
    # the Hugging Face fields beside it, and the report with the date and time in its name
    assert f"wrote {tmp_path / 'best-hf.yaml'} (Hugging Face TrainingArguments)" in proc.stdout
    assert "optim:" in (tmp_path / "best-hf.yaml").read_text()
    [report] = tmp_path.glob("best-report-20*.txt")
    assert "Recommended:" in report.read_text() and f"wrote {report}" in proc.stdout
    proc2 = gputune(*args)
    # Nothing measured twice (the first run also taught the priors: bf16 on the CPU is slow,
    # and may not be proposed again).
    assert proc2.returncode == 0 and proc2.stdout.count("skipped as measured") >= 2
    assert ": 0 ran, " in proc2.stdout
    assert len(list(tmp_path.glob("best-report-20*.txt"))) == 2  # one per run, to compare
    kept = tmp_path / "best.toml.1"  # the first run's export, where the second's differs
    assert ("kept the previous best.toml as best.toml.1" in proc2.stdout) == kept.exists()
    # --fresh: what the store holds is measured again. (Of the space, the baseline alone: one
    # stored trial shows it as well as three would.)
    fresh = [a for a in args if a not in ("--compare", str(current))]
    fresh[fresh.index("precision=fp32,bf16")] = "precision=fp32"
    proc3 = gputune(*fresh, "--fresh")
    assert proc3.returncode == 0 and "skipped as measured" not in proc3.stdout
    assert ": 1 ran, " in proc3.stdout, proc3.stdout[-3000:]  # (the baseline, measured again)


@pytest.mark.parametrize("args, message", [
    (["--max-memory", "lots"], "--max-memory 'lots' is not a size"),
    (["--search", "precision=fp64"], "precision = 'fp64' is not allowed"),
    (["--search", "precison=fp32"], "unknown option 'precison'"),
    (["--search", "precision"], "must look like KEY=V1,V2"),
    (["--budget-minutes", "-1"], "--budget-minutes -1 is out of range"),
    (["--steps", "0"], "--steps 0 is out of range"),
    (["--out", "x.yaml"], "unknown file format 'yaml'"),
    (["--out", "/no/such/folder/g.toml"], "its folder does not exist"),
    (["--set", "precision=bf16", "--search", "precision=fp32"], "both name one option"),
    (["--compare", "/no/such.toml"], "configuration file /no/such.toml does not exist"),
])
def test_tune_bad_input_is_one_line_and_exit_2(gputune, args, message):
    proc = gputune("tune", "--device", "cpu", *args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_compile_cache_is_shared_under_the_home_unless_the_user_set_one(home, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert search.compile_cache_environ()["TORCHINDUCTOR_CACHE_DIR"] == str(home / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert "TORCHINDUCTOR_CACHE_DIR" not in search.compile_cache_environ()


def test_a_reference_over_the_budget_runs_where_the_device_holds_it(home):
    """The fp32 reference at batch 16 is over the budget (by estimate), but a reference is run
    for its losses, not recommended: the device (this machine's memory) holds it, so it runs and
    the batch-16 configuration is checked. The runner stands in for the worker so that the peaks
    are exact."""
    MiB_per_sample = {("fp32", "off"): 4, ("fp32", "full"): 1, ("bf16", "off"): 2}
    sent = []

    class FakeRuns(WorkerExecutor):  # a real worker describes the machine; the runs are fake
        def run(self, config, plan, reference, *args):
            return runner(config, plan, reference)

    def runner(config, plan, reference):
        batch = config.batch_size or 8
        sent.append((config.precision, config.checkpointing, batch))
        losses = tuple(5.0 - 0.1 * i for i in range(plan.warmup_steps + plan.steps))
        ok = bool(reference) and all(abs(a - b) <= 1e-6 for a, b in zip(reference, losses))
        return TrialResult(
            config=config.to_dict(), label=config.label(), status="ok", tokens_per_s=100.0 * batch,
            step_ms=1.0, batch_size=batch,
            peak_memory_bytes=MiB_per_sample[(config.precision, config.checkpointing)] * batch * MiB,
            losses=losses, loss_ok=ok if reference else None,
            loss_max_rel_error=0.0 if reference else None, loss_tolerance=0.03,
        )

    store = ResultStore(home / "results.sqlite3")
    spec = WorkerSpec(workload="gpt2-tiny", device="cpu")
    plan = SearchPlan(spec, steps=2, warmup_steps=1, max_memory_bytes=50 * MiB,
                      fixed={"precision": "bf16", "attention": "manual", "compile_mode": "off",
                             "optimizer": "plain", "fused_kernels": (), **MEMORY_LEVERS_HELD},
                      choices={"batch_size": ("x2",)}, remeasure_repeats=0)
    outcome = Search(plan, store, out=io.StringIO(), executor=FakeRuns(spec)).run()
    # The baseline at the run's batch (16) is bf16: the reference there runs first, over the
    # budget (64 MiB) but not over what the device holds.
    assert sent[:2] == [("fp32", "off", 16), ("bf16", "off", 16)]
    best = outcome.recommendation
    assert best.batch_size == 16 and best.loss_ok is True
    store.close()


def test_an_unchecked_recommendation_names_the_batch_its_numerics_were_checked_at():
    # The fp32 reference at batch 16 did not run (out of memory or out of time); the same
    # precision, compile and kernels kept the loss at batch 8, and the reason says so.
    space = default_space(GPU, 2)
    common = {"precision": "bf16", "attention": "sdpa", "compile_mode": "default"}
    big = TuneConfig.from_dict({**common, "batch_size": 16})
    small = TuneConfig.from_dict({**common, "batch_size": 8})
    top = dataclasses.replace(row_of(59e3, 1, **big.to_dict()), loss_ok=None, batch_size=16)
    checked = dataclasses.replace(row_of(57e3, 1, **small.to_dict()), batch_size=8,
                                  loss_max_rel_error=1.1e-3, loss_tolerance=0.03)
    other = dataclasses.replace(row_of(50e3, 1, precision="fp16", batch_size=8), batch_size=8)

    def reason(results):
        outcome = search.SearchOutcome(
            results=results, ranked=results, eligible=len(results), front=[], recommendation=top,
            reason="", environment={}, workload={}, workload_key="", space=space, budget_bytes=1)
        return search.explain(outcome)

    assert "its loss checked at batch 8: within 1.1e-03 of the fp32 reference; no fp32 " \
           "reference ran at batch 16" in reason([top, checked, other])
    assert "its loss could not be checked: no fp32 reference ran at batch 16" in reason([top, other])


def test_a_search_where_nothing_finished_says_how_each_trial_ended_and_what_to_give():
    # A 268M model with a vocabulary of 262k on two CPU cores and a 2-minute budget: the
    # baseline gave no result within its timeout and the reference was stopped at the budget's
    # end. Not "no configuration ran within the memory budget": nothing had a memory budget.
    from tuner_tui.engine.search.report import why_none

    base = TrialResult(config={}, label="fp32", status="crash",
                       message="no result within 81 s; the worker was stopped")
    ref = TrialResult(config={}, label="fp32 + sdpa", status="timeout",
                      message="stopped at the time budget's end after 46 s")
    text = why_none([base, ref])
    assert text == ("no configuration finished its measured steps: of 2 trials, 1 gave no "
                    "result within its trial's timeout, 1 was stopped at the time budget's end; "
                    "the model's steps are too slow for the time its trials were given: shorter "
                    "sequences (--seq-len) or a smaller batch (--set batch_size=N), or more time "
                    "(--budget-minutes)"), text
    # Without a time budget (--budget-minutes 0) each trial's timeout ended it: more time is
    # not what it needs.
    assert why_none([base, base]).endswith("of 2 trials, 2 gave no result within its trial's "
                                           "timeout; the model's steps are too slow for the "
                                           "time its trials were given: shorter sequences "
                                           "(--seq-len) or a smaller batch (--set batch_size=N)")
    # Stopped at --trial-timeout with its steps still coming: a longer one would do
    slow = dataclasses.replace(base, message="no result within 900 s; the worker was stopped (it "
                               "was still stepping: 20 of 25 steps, 40.0 s a step, 200 s more "
                               "needed; its limit was 900 s)")
    assert why_none([slow]).endswith("(--set batch_size=N), or a longer --trial-timeout")
    oom = TrialResult(config={}, label="fp32", status="oom", message="out of memory")
    assert why_none([oom]) == ("no configuration finished its measured steps: of 1 trial, "
                               "1 ran out of memory")
    ran = dataclasses.replace(oom, status="loss-mismatch", tokens_per_s=5e3)
    assert why_none([oom, ran]).startswith("no configuration of the space ran within the memory")


def test_a_search_whose_every_trial_raised_the_baseline_s_error_says_it_is_the_workload_s():
    # A user's MLP with every parameter frozen: four trials, each "element 0 of tensors does not
    # require grad"; no configuration mends the workload's own code.
    from tuner_tui.engine.search.report import why_none

    error = ("RuntimeError: element 0 of tensors does not require grad and does not have a "
             "grad_fn")
    rows = [TrialResult(config=config, label="x", status="crash", message=error)
            for config in ({}, {"attention": "sdpa"}, {"optimizer": "fused"})]
    text = why_none(rows)
    assert text.endswith(f"3 crashed; each crash raised the same error, the fp32 eager "
                         f"baseline's (your model and code as written) too: {error}; it comes "
                         "from the workload itself, and the run's worker log has its "
                         "traceback"), text
    # Not where the errors differ, the baseline did not raise it, or the workers died or hung
    other = dataclasses.replace(rows[2], message="RuntimeError: another")
    assert "same error" not in why_none([*rows[:2], other])
    assert "same error" not in why_none(rows[1:])
    died = [dataclasses.replace(r, message="the worker process died (exit code -9)")
            for r in rows]
    assert "same error" not in why_none(died)
    hung = [dataclasses.replace(r, message="no result within 81 s; the worker was stopped")
            for r in rows]
    assert "same error" not in why_none(hung)
    # The baseline alone (the search found nothing else to run): said of it
    assert why_none(rows[:1]).endswith(f"1 crashed; the fp32 eager baseline (your model and "
                                       f"code as written) raised: {error}; it comes from the "
                                       "workload itself, and the run's worker log has its "
                                       "traceback")
    assert "raised" not in why_none(rows[1:2])


def test_where_the_runs_time_went_sums_their_parts_and_names_the_rest():
    from tuner_tui.engine.search.report import time_spent

    timeline = [
        {"how": "ran", "started_s": 10.0, "ended_s": 40.0,
         "phases_s": {"build": 2.0, "first step": 20.0, "held": 3.0, "measured": 1.0}},
        {"how": "reused", "started_s": 40.0, "ended_s": 40.0, "phases_s": {}},
        {"how": "ran", "started_s": 40.0, "ended_s": 50.0,  # a crash: its worker timed nothing
         "phases_s": {}},
        {"how": "ran", "started_s": 50.0, "ended_s": 62.0,
         "phases_s": {"build": 1.0, "first step": 4.0, "held": 5.0, "measured": 1.0}},
    ]
    line = time_spent(timeline)
    assert line.startswith("Where the runs' time went (3 runs, 0m52s): first steps (compiles) "
                           "24 s, measured steps held while another worker started or ended 8 s, "
                           "builds 3 s, measured steps 2 s; the rest, 15 s: waiting for a worker's")
    assert time_spent([{"how": "reused", "started_s": 0.0, "ended_s": 0.0}]) is None


def test_the_best_over_time_is_told_in_the_workloads_items():
    from tuner_tui.engine.search.report import best_over_time

    timeline = [
        {"label": "fp32", "why": "the fp32 eager baseline", "ended_s": 28.0,
         "best_label": "fp32", "best_tokens_per_s": 779.0},
        {"label": "bf16 + compile", "why": "the expert's recipe", "ended_s": 106.0,
         "best_label": "bf16 + compile", "best_tokens_per_s": 6800.0},
        {"label": "bf16", "why": "move", "ended_s": 150.0,
         "best_label": "bf16 + compile", "best_tokens_per_s": 6800.0},
    ]
    lines = best_over_time(timeline, "images")
    assert len(lines) == 2 and "tokens" not in " ".join(lines)
    assert "779 images/s  fp32: the fp32 eager baseline" in lines[0]
    assert "6.8k images/s  bf16 + compile: the expert's recipe" in lines[1]



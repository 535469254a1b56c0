"""The worker process with the real training loop on the CPU: trials, the live run, faults."""

import contextlib
import os
import signal
import time

import pytest

from strategies.config import TuneConfig
from tuner_tui.engine import protocol as P
from tuner_tui.engine.client import WorkerClient
from tuner_tui.engine.protocol import WorkerSpec
from shared_runs import SHARED_GPT2_WORKER
from worker_events import until

shared = pytest.mark.xdist_group(SHARED_GPT2_WORKER)
"""Tests on the session's gpt2-tiny worker (`gpt2_worker`, tests/engine/conftest.py)."""
OOM_WORKER = "test_worker-oom-above-8-fp32"


@pytest.fixture
def worker():
    clients = []

    def start(**spec):
        c = WorkerClient(WorkerSpec(**{"workload": "gpt2-tiny", "device": "cpu", **spec}))
        c.start()
        ready, _ = until(c, (P.WorkerReady, P.RunFailed))
        clients.append(c)
        return c, ready

    yield start
    for c in clients:
        c.stop()
        assert not c.is_alive()


@shared
def test_ready_event_describes_machine_and_workload(gpt2_worker):
    _, ready = gpt2_worker
    assert isinstance(ready, P.WorkerReady)
    assert ready.capabilities["device"] == "cpu" and ready.capabilities["cuda"] is False
    assert "device = cpu" in ready.capabilities["reasons"]["cuda"]
    assert ready.workload["name"] == "gpt2-tiny" and ready.workload["items_per_sample"] == 64
    # What gpt2-tiny does not use, for labels, the options panel and the search.
    assert ready.workload["inapplicable"]["fused_kernels=rms_norm"].startswith("no RMSNorm")
    assert ready.environment["torch"]
    # What the start took, part by part (on a GPU the first trial waited 12-21 s for it).
    assert list(ready.startup_s) == ["python", "torch", "workload", "first batch", "machine",
                                     "model facts"]
    assert all(s is None or 0 <= s < 120 for s in ready.startup_s.values())


@shared
def test_trial_reports_measured_figures_and_checks_the_loss(gpt2_worker):
    client, _ = gpt2_worker
    # (max_steps: exactly the planned steps, however noisy the host; tests/engine/test_noise.py
    # has the adaptation)
    client.send(P.RunTrial(TuneConfig.from_dict({}), steps=4, warmup_steps=2, max_steps=4))
    done, events = until(client, (P.TrialFinished, P.RunFailed))
    ref = done.result
    assert ref.status == "ok" and ref.measured_steps == 4 and len(ref.losses) == 6
    assert ref.tokens_per_s > 0 and ref.step_ms > 0 and ref.compile_s > 0
    assert ref.peak_memory_bytes is not None and ref.mfu is None  # no MFU on the CPU
    steps = [e.step for e in events if isinstance(e, P.StepMeasured)]
    assert steps == list(range(6))
    # Signs of life within the warm-up steps, none in the measured ones: the runner tells a
    # slow trial from a hung one by them
    parts = [(e.step, e.part) for e in events if isinstance(e, P.StepPart)]
    assert parts == [(0, "forward"), (0, "backward"), (1, "forward"), (1, "backward")]
    # Where its time went, part by part; nothing held it.
    assert list(ref.phases_s) == ["reference gradients", "build", "first step", "warm-up",
                                  "held", "measured"]
    assert all(s >= 0 for s in ref.phases_s.values()) and ref.phases_s["held"] < 0.2

    # Same seed, same batches: the same configuration reproduces the losses exactly, and a
    # different precision stays within its tolerance.
    client.send(P.RunTrial(TuneConfig.from_dict({"precision": "bf16", "attention": "sdpa"}), steps=4, warmup_steps=2,
                           reference_losses=ref.losses))
    done, _ = until(client, (P.TrialFinished, P.RunFailed))
    assert done.result.status == "ok" and done.result.loss_ok is True

    # A wrong reference is caught as a mismatch.
    bad = tuple(x * 1.5 for x in ref.losses)
    client.send(P.RunTrial(TuneConfig.from_dict({}), steps=2, warmup_steps=2, reference_losses=bad))
    done, _ = until(client, (P.TrialFinished, P.RunFailed))
    assert done.result.status == "loss-mismatch" and done.result.loss_ok is False
    assert "fp32 reference" in done.result.message


@shared
def test_live_run_applies_new_configurations_pauses_and_resumes(gpt2_worker):
    client, _ = gpt2_worker
    client.send(P.ApplyConfig(TuneConfig.from_dict({}), measure_steps=3))
    started, _ = until(client, P.RunStarted)
    finished, _ = until(client, P.TrialFinished)
    assert finished.run_id == started.run_id and finished.result.status == "ok"

    client.send(P.ApplyConfig(TuneConfig.from_dict({"checkpointing": "full"}), measure_steps=3))
    started2, _ = until(client, P.RunStarted)
    assert started2.run_id > started.run_id and "ckpt full" in started2.label
    finished2, _ = until(client, P.TrialFinished)
    assert finished2.result.loss_ok is True  # checked against the cached fp32 reference
    assert finished2.result.strategy_report["checkpointing"]["blocks"] == 2

    client.send(P.Pause())
    until(client, P.Paused)
    time.sleep(0.5)
    while client.poll(0.2):  # drain what was in flight
        pass
    assert client.poll(1.0) is None  # paused: no more steps
    client.send(P.Resume())
    until(client, P.Resumed)
    until(client, P.StepMeasured)


@pytest.fixture(scope="module")
def _oom_worker_process():
    # fp32 above batch 8 runs out of memory (the run, and its fp32 reference, with full
    # checkpointing too); bf16 fits. One worker for the three tests of injected OOMs.
    c = WorkerClient(WorkerSpec(workload="gpt2-tiny", device="cpu",
                                fault_injection="oom-above:8:fp32"))
    c.start()
    until(c, (P.WorkerReady,))
    yield c
    c.stop()
    assert not c.is_alive()


@pytest.fixture
def oom_worker(_oom_worker_process):
    """The module's worker with OOMs injected, idle: no live run, no event of an earlier test."""
    client = _oom_worker_process
    assert client.is_alive()
    client.send(P.Pause())
    until(client, (P.Paused,))
    while client.poll(0.2) is not None:
        pass
    return client


@pytest.mark.xdist_group(OOM_WORKER)
def test_oom_is_reported_and_the_worker_goes_on(oom_worker):
    client = oom_worker
    client.send(P.RunTrial(TuneConfig.from_dict({"batch_size": 16}), steps=2, warmup_steps=1))
    failed, _ = until(client, (P.RunFailed, P.TrialFinished))
    assert isinstance(failed, P.RunFailed) and failed.kind == "oom"
    assert "Tried to allocate 64.00 GiB" in failed.message
    assert "checkpointing" in failed.message and "smaller batch" in failed.message
    assert client.is_alive()


@pytest.mark.xdist_group(OOM_WORKER)
def test_an_oom_while_applying_belongs_to_the_new_request_not_the_run_it_replaces(oom_worker):
    client = oom_worker
    client.send(P.ApplyConfig(TuneConfig.from_dict({}), measure_steps=2))
    first, _ = until(client, P.TrialFinished)
    assert first.result.status == "ok"
    # Batch 16 runs out of memory: first its fp32 reference (plain, then fully checkpointed),
    # which is given up, then the run itself.
    client.send(P.ApplyConfig(TuneConfig.from_dict({"batch_size": 16}), measure_steps=2))
    failed, seen = until(client, (P.RunFailed, P.TrialFinished))
    assert isinstance(failed, P.RunFailed) and failed.kind == "oom"
    assert failed.run_id > first.run_id
    # Steps in flight came from the old run; the failed request measured none.
    assert {e.run_id for e in seen if isinstance(e, P.StepMeasured)} <= {first.run_id}
    started = [e for e in seen if isinstance(e, P.RunStarted)]
    assert [(e.run_id, e.batch_size) for e in started] == [(failed.run_id, 16)]
    client.send(P.ApplyConfig(TuneConfig.from_dict({}), measure_steps=2))  # and the worker goes on
    again, _ = until(client, (P.TrialFinished, P.RunFailed))
    assert again.result.status == "ok" and again.run_id > failed.run_id


@pytest.mark.xdist_group(OOM_WORKER)
def test_a_reference_that_does_not_fit_leaves_the_loss_unchecked_not_the_run_refused(oom_worker):
    # fp32 above batch 8 runs out of memory (with full checkpointing too); bf16 fits.
    client = oom_worker
    client.send(P.ApplyConfig(TuneConfig.from_dict({"precision": "bf16", "batch_size": 16}), measure_steps=2))
    done, seen = until(client, (P.TrialFinished, P.RunFailed))
    assert isinstance(done, P.TrialFinished) and done.result.status == "ok"
    assert done.result.loss_ok is None and done.result.batch_size == 16
    warnings = [e.text for e in seen if isinstance(e, P.WorkerLog)]
    assert any("fp32 reference at batch 16 does not fit" in w for w in warnings)


def test_diverged_run_is_marked(worker):
    client, _ = worker(workload="tests.engine.user_workloads:exploding")
    client.send(P.RunTrial(TuneConfig.from_dict({}), steps=3, warmup_steps=1))
    failed, _ = until(client, (P.RunFailed, P.TrialFinished))
    assert isinstance(failed, P.RunFailed) and failed.kind == "diverged"
    assert "inf" in failed.message
    client.send(P.RunTrial(TuneConfig.from_dict({}), steps=1, warmup_steps=1))  # still serving
    done, _ = until(client, (P.RunFailed, P.TrialFinished))
    assert done.result.status in ("ok", "diverged")


@shared
def test_invalid_configuration_for_the_device_is_refused(gpt2_worker):
    client, _ = gpt2_worker
    client.send(P.RunTrial(TuneConfig.from_dict({"compile_mode": "reduce-overhead"}), steps=1))
    failed, _ = until(client, (P.RunFailed, P.TrialFinished))
    assert failed.kind == "invalid" and "reduce-overhead" in failed.message


def test_a_killed_worker_is_noticed(worker):
    client, _ = worker(workload="tests.engine.user_workloads:tiny_mlp")  # (any: up the soonest)
    os.kill(client.pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while client.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_alive() and client.exitcode() == -signal.SIGKILL
    # A trial whose worker is killed so says what most often kills it
    from tuner_tui.engine.runner import died

    assert died(client.exitcode()).endswith("most often by the kernel's out-of-memory killer")
    assert died(-11) == "the worker process died (exit code -11)"


@pytest.mark.slow
def test_graph_break_under_fullgraph_is_a_compile_failure_with_its_location(worker):
    client, _ = worker(workload="tests.engine.user_workloads:graph_break")
    client.send(P.RunTrial(TuneConfig.from_dict({"compile_mode": "default", "compile_fullgraph": True}), steps=1,
                           warmup_steps=1))
    failed, _ = until(client, (P.RunFailed, P.TrialFinished), timeout=300)
    assert isinstance(failed, P.RunFailed) and failed.kind == "compile", failed
    assert failed.message.startswith("compile failed:")
    assert "user_workloads.py" in failed.message  # where the break is
    # Without fullgraph the same model runs, with the break falling back to eager.
    client.send(P.RunTrial(TuneConfig.from_dict({"compile_mode": "default"}), steps=1, warmup_steps=1))
    done, _ = until(client, (P.RunFailed, P.TrialFinished), timeout=300)
    assert isinstance(done, P.TrialFinished) and done.result.status == "ok"


@pytest.mark.slow
def test_recompiles_past_the_limit_are_reported(worker):
    client, _ = worker(workload="tests.engine.user_workloads:recompiles")
    client.send(P.RunTrial(TuneConfig.from_dict({"compile_mode": "default"}), steps=2, warmup_steps=1))
    done, events = until(client, (P.RunFailed, P.TrialFinished), timeout=300)
    logs = [e.text for e in events if isinstance(e, P.WorkerLog)]
    assert any("recompile" in t.lower() and "limit" in t.lower() for t in logs), logs


@shared
def test_measured_steps_wait_while_the_next_worker_starts_and_the_wait_is_not_timed(gpt2_worker):
    from tuner_tui.engine import runner

    spec = WorkerSpec(workload="gpt2-tiny", device="cpu")
    current, _ = gpt2_worker  # (started by runner.start_worker or not: the same client)
    next_worker = runner.NextWorker(spec)
    try:
        next_worker.begin(current)
        current.send(P.RunTrial(TuneConfig.from_dict({}), steps=3, warmup_steps=2, max_steps=3))
        measured_while_starting = []
        while True:
            event = current.wait_event(120)
            assert event is not None, "no event within 120 s"
            if isinstance(event, P.StepMeasured) and event.step >= 2:
                measured_while_starting.append(not next_worker.is_ready())
            if isinstance(event, (P.TrialFinished, P.RunFailed)):
                break
        assert isinstance(event, P.TrialFinished) and event.result.status == "ok"
        assert measured_while_starting == [False, False, False]
        # The row says how long its measured steps were held (a start imports torch: > 0.5 s).
        assert event.result.phases_s["held"] > 0.5
        client, ready = next_worker.take()
        assert client.is_alive() and ready.pid == client.pid != current.pid
        client.stop()
    finally:
        next_worker.close()


@shared
def test_a_held_trial_is_released_when_the_next_worker_fails_to_start(gpt2_worker):
    from tuner_tui.engine import runner

    current, _ = gpt2_worker
    next_worker = runner.NextWorker(WorkerSpec(workload="no_such_module:nothing", device="cpu"))
    try:
        next_worker.begin(current)
        current.send(P.RunTrial(TuneConfig.from_dict({}), steps=2, warmup_steps=1))
        done, _ = until(current, (P.TrialFinished, P.RunFailed))
        assert isinstance(done, P.TrialFinished) and done.result.status == "ok"
        with pytest.raises(runner.WorkerStartError):
            next_worker.take()
    finally:
        next_worker.close()


def test_a_worker_that_dies_at_its_start_says_where_its_output_is(tmp_path):
    from tuner_tui.engine import runner

    log = tmp_path / "worker.log"
    spec = WorkerSpec(workload="tests.engine.user_workloads:dies_as_it_builds", device="cpu",
                      log_path=str(log))
    with pytest.raises(runner.WorkerStartError,
                       match=rf"^the worker did not start \(exit code 3\); its output is in {log}$"):
        runner.start_worker(spec, timeout=120)


def test_a_failed_step_releases_its_memory_after_its_tensors_are_gone(monkeypatch):
    # While an exception is being handled, its traceback keeps the failed step's frames and
    # tensors alive: emptying the CUDA cache then frees nothing (seen on the H200: 140 GiB
    # still in use after an OOM). The release must come after, when they are gone.
    import queue

    from tests.engine import user_workloads
    from tuner_tui.engine import trial
    from tuner_tui.engine.worker import Worker

    released_after = []
    real_release = trial.release_memory

    def spy():
        released_after.append([ref() is None for ref in user_workloads.HELD_BY_FAILED_STEP])
        real_release()

    monkeypatch.setattr(trial, "release_memory", spy)
    events = queue.Queue()
    spec = WorkerSpec(workload="tests.engine.user_workloads:oom_in_step", device="cpu")
    worker = Worker(spec, queue.Queue(), events)
    assert worker.start()
    for apply in (worker.apply_config, worker.run_trial):
        user_workloads.HELD_BY_FAILED_STEP.clear()
        released_after.clear()
        cmd = P.ApplyConfig(TuneConfig.from_dict({}), measure_steps=2) if apply == worker.apply_config else P.RunTrial(TuneConfig.from_dict({}), 2, 1)
        apply(cmd)
        seen = []
        while not events.empty():
            seen.append(events.get())
        failed = [e for e in seen if isinstance(e, P.RunFailed)]
        assert failed and failed[-1].kind == "oom"
        assert user_workloads.HELD_BY_FAILED_STEP and released_after
        assert all(released_after[-1]), f"{apply.__name__}: released while the step's tensors lived"
        assert worker.trainer is None


STEP_FROM_CACHE = """
import json, torch
from types import SimpleNamespace
from torch._dynamo.utils import counters
from strategies import optimizer
from tuner_tui.engine import workloads
workload = workloads.load("gpt2-tiny", None, 0, None, "cpu")
model = workload.build_model()
stepping, _ = optimizer.build(workload.make_optimizer(model), SimpleNamespace(
    weights="fp32", optimizer_state="bf16", optimizer="plain"))
for p in model.parameters():
    p.grad = torch.full_like(p, 1e-3)
stepping.step()
print(json.dumps(dict(counters["inductor"])))
"""


def _nice_of_each_thread(pid: int) -> set[int]:
    """The nice values of a process's threads (Linux: each thread has its own)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                found.add(int(stat.read().rsplit(")", 1)[1].split()[16]))
    return found


def test_optimizer_steps_compiled_by_a_worker_of_their_own_are_the_trial_s_own(tmp_path):
    """torchao's AdamW step, compiled by the optimizer steps' worker over stand-ins of the
    model's parameters (`runner.OptimizerStepWarmup`), is what the model's own optimizer steps
    with: in a fresh process, every graph of its first step comes from the Inductor cache."""
    import json
    import subprocess
    import sys

    from tuner_tui.engine import runner

    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    spec = WorkerSpec(workload="gpt2-tiny", device="cpu", environ=tuple(env.items()))
    variants = (("fp32", "bf16"), ("fp64", "bf16"))  # the second: no such weights
    warmup = runner.OptimizerStepWarmup(spec, variants)
    seen, nice = set(), set()
    try:
        deadline = time.monotonic() + 240
        while len(warmup.done()) < len(variants) and time.monotonic() < deadline:
            seen.update(warmup.what_happened())
            if any("is compiling" in n for n in seen):
                nice |= _nice_of_each_thread(warmup._client.pid)
            time.sleep(0.5)
        done = warmup.done()
    finally:
        warmup.close()
    assert warmup.started.is_set()
    assert any("the worker is compiling fp32 weights + bf16 state, for" in n for n in seen)
    assert nice == {19}  # every thread of it while it compiles, those made before it too
    notes = warmup.what_happened()  # the failed pair, said; nothing is compiling any more
    assert len(notes) == 1 and "could not compile fp64 weights + bf16 state" in notes[0]
    assert done[("fp32", "bf16")] > 0 and done[("fp64", "bf16")] is None  # failed, reported
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ran = subprocess.run([sys.executable, "-c", STEP_FROM_CACHE], capture_output=True, text=True,
                         env={**os.environ, **env, "PYTHONPATH": root}, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    inductor = json.loads(ran.stdout.strip().splitlines()[-1])
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and not inductor.get("fxgraph_cache_miss")


def test_the_optimizer_steps_worker_that_dies_is_started_again_for_the_pairs_left(monkeypatch):
    """A worker that dies (killed here, as the kernel's OOM killer or a CUDA fault would) is
    noted with the pair it was compiling, which is not tried again; a fresh worker takes the
    pairs left, and its start holds the trials' measurements like the first one's."""
    from tuner_tui.engine import runner

    monkeypatch.setattr(runner.OptimizerStepWarmup, "RESTART_AFTER_S", 0.2)
    variants = (("bf16", "fp32"), ("bf16", "bf16"))
    warmup = runner.OptimizerStepWarmup(WorkerSpec(workload="gpt2-tiny", device="cpu"), variants)
    killed, held_again = [], False
    try:
        deadline = time.monotonic() + 120
        while len(killed) < 2 and time.monotonic() < deadline:
            held_again = held_again or (len(killed) == 1 and not warmup.started.is_set())
            client = warmup._client
            if warmup.started.is_set() and client.is_alive() and client not in killed:
                os.kill(client.pid, signal.SIGKILL)
                killed.append(client)
            time.sleep(0.05)
        warmup._thread.join(timeout=60)
    finally:
        warmup.close()
    assert len(killed) == 2 and held_again  # the second, a fresh worker, held trials as it started
    assert warmup.done() == {("bf16", "fp32"): None, ("bf16", "bf16"): None}
    notes = warmup.what_happened()
    assert len(notes) == 2 and all("died (exit code -9) while compiling" in n for n in notes)
    assert "bf16 weights + fp32 state" in notes[0] and "bf16 weights + bf16 state" in notes[1]


def test_an_optimizer_steps_worker_that_cannot_start_is_noted_and_not_started_again(monkeypatch):
    """A start that fails for good (an invalid workload) is said once, in the notes the report
    prints; nothing waits on it."""
    from tuner_tui.engine import runner

    monkeypatch.setattr(runner.OptimizerStepWarmup, "RESTART_AFTER_S", 0.2)
    warmup = runner.OptimizerStepWarmup(WorkerSpec(workload="nosuch", device="cpu"),
                                        (("bf16", "fp32"),))
    try:
        warmup._thread.join(timeout=60)
    finally:
        warmup.close()
    assert warmup.started.is_set() and warmup.done() == {}
    notes = warmup.what_happened()
    assert len(notes) == 1 and "did not start: unknown workload 'nosuch'" in notes[0]


def test_a_pair_that_runs_out_of_memory_is_tried_once_more_after_the_others():
    """On a GPU a trial beside the optimizer steps' worker can fill the memory for a while: a
    pair that ran out of it is compiled again after the others, the rest are not."""
    import torch

    from tuner_tui.engine import optimizer_steps, workloads

    workload = workloads.load("gpt2-tiny")
    calls = []

    def build():  # the pairs in order (fp32's, bf16's), then fp32's once more
        calls.append(len(calls))
        if len(calls) == 2:
            raise ValueError("no such layer")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    workload.build_model = build
    reported = []
    optimizer_steps.compile_all(workload, "cpu", (("fp32", "bf16"), ("bf16", "bf16")),
                                lambda *done: reported.append(done), retry_after_s=0.0)
    assert [(w, s) for w, s, _, _ in reported] == [("bf16", "bf16"), ("fp32", "bf16")]
    assert len(calls) == 3  # the out-of-memory one twice, the other once
    assert "no such layer" in reported[0][3] and "out of memory" in reported[1][3]


def test_a_trial_waits_for_the_optimizer_steps_worker_s_start_no_longer_than_its_cap(
        monkeypatch):
    """A trial's measured steps are held while the optimizer steps' worker starts, but a start
    that takes long (a hung CUDA init) releases them after `HOLD_AT_MOST_S`."""
    import threading

    from tuner_tui.engine import runner

    class Trial:  # what the hold needs of a trial's client: to be held and released
        def __init__(self):
            self.held, self.released = 0, threading.Event()

        def hold_measurement(self):
            self.held += 1

        def release_measurement(self):
            self.released.set()

    monkeypatch.setattr(runner.OptimizerStepWarmup, "HOLD_AT_MOST_S", 0.2)
    warmup = runner.OptimizerStepWarmup(WorkerSpec(workload="gpt2-tiny", device="cpu"),
                                        (("bf16", "fp32"),))
    trial = Trial()
    try:
        warmup.hold_until_started(trial)
        assert trial.held == 1
        assert trial.released.wait(1.0) and not warmup.started.is_set()  # before it was up
    finally:
        warmup.close()


def test_the_last_trial_s_worker_ends_beside_the_next_trial_not_in_its_measured_steps(
        monkeypatch):
    """A trial's worker is stopped in the background: its exit (a CUDA context's teardown, the
    compile workers' shutdown) is not charged to the trial, and the next trial's measured steps
    begin only once it has exited."""
    import io

    from tuner_tui.engine.progress import Progress
    from tuner_tui.engine.runner import TrialPlan
    from tuner_tui.engine.search.executor import WorkerExecutor

    real_stop, exited = WorkerClient.stop, {}

    def slow_stop(self, timeout=5.0):
        pid = self.pid
        time.sleep(2.0)  # a slow exit
        real_stop(self, timeout)
        exited[pid] = time.monotonic()

    monkeypatch.setattr(WorkerClient, "stop", slow_stop)

    class Measuring(Progress):  # when a trial's measured steps were first reported
        first = None

        def set(self, state, detail=""):
            if state == "measuring" and self.first is None:
                self.first = time.monotonic()
            super().set(state, detail)

    executor = WorkerExecutor(WorkerSpec(workload="gpt2-tiny", device="cpu"))
    plan = TrialPlan(steps=2, warmup_steps=1, trial_timeout_s=120)
    try:
        first = executor.start().pid
        done = executor.run(TuneConfig.from_dict({}), plan, (), Progress(io.StringIO()), None, None)
        assert done.status == "ok" and first not in exited  # returned before its worker ended
        progress = Measuring(io.StringIO())
        again = executor.run(TuneConfig.from_dict({}), plan, (), progress, None, None)
        assert again.status == "ok" and progress.first > exited[first]
    finally:
        executor.close()
    # Stopped by `close`: the last trial's worker and the one started for a next trial
    assert len(exited) == 3

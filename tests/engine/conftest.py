import os
import signal
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_gputune(*args, timeout=600, cwd=None):
    """Run the real command in a subprocess, as a user would."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TRITON_INTERPRET", None)

    def run():
        return subprocess.run(
            [sys.executable, "-m", "tuner_tui.cli", *args],
            capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or ROOT,
        )

    if "GPUTUNE_HOME" in env:  # the test chose the home (and cleans it up)
        return run()
    # bench and tune record in the result store and reuse what it holds: a fresh one per call,
    # so no run reuses another test's (or another session's) rows; removed after the call.
    with tempfile.TemporaryDirectory(prefix="gputune-test-home-",
                                     ignore_cleanup_errors=True) as home:
        env["GPUTUNE_HOME"] = home
        return run()


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """`cli.main` run in this process installs gputune's handlers (`cli_stop`): Ctrl-C, SIGTERM
    and SIGHUP raise KeyboardInterrupt and start a watchdog that ends the process 30 s later,
    and an interrupt Python swallowed is sent again (sys.unraisablehook). Each test gives the
    pytest worker back the handlers it found."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {s: signal.getsignal(s) for s in signals}
    unraisable = sys.unraisablehook
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    sys.unraisablehook = unraisable


@pytest.fixture
def gputune():
    return run_gputune


@pytest.fixture(scope="session")
def _gpt2_worker_process():
    import psutil

    from tuner_tui.engine import protocol as P
    from tuner_tui.engine.client import WorkerClient
    from tuner_tui.engine.protocol import WorkerSpec
    from worker_events import until

    client = WorkerClient(WorkerSpec(workload="gpt2-tiny", device="cpu"))
    client.start()
    ready, _ = until(client, (P.WorkerReady, P.RunFailed))
    yield client, ready
    pid = client.pid
    left = psutil.Process(pid).children(recursive=True) if psutil.pid_exists(pid) else []
    client.stop()
    assert not client.is_alive()
    psutil.wait_procs(left, timeout=10)
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def idle(client) -> None:
    """Make a shared worker idle: a live run an earlier test left training is ended (a trial
    refused on this device ends it first, as any trial does, and costs nothing else), and every
    event sent until then is drained."""
    from strategies.config import TuneConfig
    from tuner_tui.engine import protocol as P
    from worker_events import until

    assert client.is_alive(), "the shared worker died in an earlier test"
    client.send(P.RunTrial(TuneConfig.from_dict({"compile_mode": "reduce-overhead"}), steps=1))
    until(client, (P.RunFailed,))
    while client.poll(0.2) is not None:
        pass


@pytest.fixture
def gpt2_worker(_gpt2_worker_process):
    """(client, its WorkerReady): one real gpt2-tiny worker on the CPU, no fault injected, shared
    by the tests that take it (marked `xdist_group(SHARED_GPT2_WORKER)`, shared_runs.py), each
    given it idle (`idle`)."""
    from tuner_tui.engine import protocol as P

    client, ready = _gpt2_worker_process
    assert isinstance(ready, P.WorkerReady), ready
    idle(client)
    return client, ready


@pytest.fixture(scope="session")
def group_trials(_gpt2_worker_process, tmp_path_factory):
    """On the shared worker (`gpt2_worker`), the same global batch of 8 trained by DDP and FSDP2
    on 2 gloo ranks and by one process: {parallel: (TrialResult, its StepMeasured events)}, and
    the folder of the DDP run's traces (`trace`): that run was profiled after its measured steps
    (tests/engine/test_group.py and test_profile.py assert on these)."""
    from strategies.config import TuneConfig
    from tuner_tui.engine import protocol as P
    from worker_events import until

    client, _ = _gpt2_worker_process
    idle(client)
    trace = tmp_path_factory.mktemp("group-traces") / "traces" / "ddp.json"
    rows = {"trace": trace}
    for parallel, devices in (("ddp", 2), ("fsdp2", 2), ("none", 1)):
        config = TuneConfig.from_dict({"parallel": parallel, "devices": devices, "batch_size": 8})
        profile = {"profile_steps": 2, "trace_path": str(trace)} if parallel == "ddp" else {}
        client.send(P.RunTrial(config, steps=3, warmup_steps=1, max_steps=3, **profile))
        done, events = until(client, (P.TrialFinished, P.RunFailed))
        assert isinstance(done, P.TrialFinished), done
        rows[parallel] = (done.result, [e for e in events if isinstance(e, P.StepMeasured)])
    return rows


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory):
    """`gputune bench --preset quick --profile` on gpt2-tiny trained on a text file (`--data`),
    run once for the tests that assert on it (marked `xdist_group(QUICK_BENCH)`, shared_runs.py):
    (the finished process, the path of its --json). 16 tokens a sample: bf16 steps on the CPU
    are slow."""
    folder = tmp_path_factory.mktemp("quick-bench")
    data = folder / "corpus.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = folder / "out.json"
    proc = run_gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--data", str(data),
                       "--seq-len", "16", "--preset", "quick", "--profile", "--json", str(out),
                       "--steps", "3", "--warmup", "2")
    return proc, out

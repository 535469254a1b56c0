"""The worker client's process hygiene, checked in a separate Python process (what a user's
terminal would show when gputune exits)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    """This checkout first on the path: the script runs from a temporary folder."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

# A parent that prepares multiprocessing as WorkerClient.start does (or not), then SIGKILLs a
# spawned child holding a registered semaphore, as a crash mid-compile leaves Inductor's pool.
SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, os, signal, sys, time
    from tuner_tui.engine import client

    def child(ready):
        lock = mp.get_context("spawn").Lock()  # registered with the parent's resource tracker
        ready.put(os.getpid())
        time.sleep(60)

    if __name__ == "__main__":
        if sys.argv[1] == "as-client":
            client._quiet_resource_tracker()
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        process = ctx.Process(target=child, args=(ready,))
        process.start()
        ready.get(timeout=60)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    """
)


def _stderr_after_a_killed_child(tmp_path: Path, mode: str) -> str:
    script = tmp_path / "killed_child.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=_env())
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_killed_worker_leaves_no_leak_warning_in_the_terminal(tmp_path):
    assert "leaked semaphore" not in _stderr_after_a_killed_child(tmp_path, "as-client")


def test_without_the_client_setup_the_tracker_would_warn(tmp_path):
    # The case the setup exists for: without it, the warning reaches the terminal.
    assert "leaked semaphore" in _stderr_after_a_killed_child(tmp_path, "plain")


# The dashboard's side of a real worker: everything that comes back, from WorkerReady to the
# trial's figures, unpickles without importing torch.
UI_SIDE = textwrap.dedent(
    """
    import sys
    from strategies.config import TuneConfig
    from tuner_tui.engine import protocol
    from tuner_tui.engine.client import WorkerClient, WorkerSpec

    if __name__ == "__main__":
        client = WorkerClient(WorkerSpec(workload="gpt2-tiny", device="cpu"))
        client.start()
        seen = []
        try:
            client.send(protocol.RunTrial(TuneConfig.from_dict({"batch_size": 2}), 2, 1, ()))
            while not seen or not isinstance(seen[-1], (protocol.TrialFinished, protocol.RunFailed)):
                event = client.wait_event(120)
                assert event is not None, seen
                seen.append(event)
        finally:
            client.stop()
        kinds = {type(e).__name__ for e in seen}
        assert {"WorkerReady", "StepMeasured", "TrialFinished"} <= kinds, kinds
        print("torch" in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:3])
    """
)


def test_the_ui_side_of_a_real_worker_imports_no_torch(tmp_path):
    script = tmp_path / "ui_side.py"
    script.write_text(UI_SIDE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "False", done.stdout


# A parent that starts a worker on a long trial, says which process it is, then waits to be
# killed: the worker must not go on training without it.
ORPHAN = textwrap.dedent(
    """
    import sys, time
    from strategies.config import TuneConfig
    from tuner_tui.engine import protocol
    from tuner_tui.engine.client import WorkerClient
    from tuner_tui.engine.protocol import WorkerSpec

    if __name__ == "__main__":
        client = WorkerClient(WorkerSpec(workload="gpt2-tiny", device="cpu"))
        client.start()
        client.send(protocol.RunTrial(TuneConfig.from_dict({}), 100000, 1))
        while True:
            event = client.wait_event(60)
            if isinstance(event, protocol.StepMeasured) and event.step >= 2:
                print(client.pid, flush=True)
                time.sleep(600)
    """
)


def test_a_worker_busy_in_a_trial_ends_when_its_parent_is_killed(tmp_path):
    import signal
    import time

    import psutil

    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=_env())
    try:
        worker_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(worker_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(worker_pid) and \
                psutil.Process(worker_pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        alive = psutil.pid_exists(worker_pid) and \
            psutil.Process(worker_pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, "the worker went on training after its parent was killed"
    finally:
        parent.kill()


LAUNCHER = """
import sys
from tuner_tui.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


def test_modules_in_the_current_folder_never_run_in_the_worker_or_the_tracker(tmp_path):
    """`gputune` started in a folder that holds a multiprocessing.py and a pickle.py: the
    worker (spawned with `python -c`) and multiprocessing's resource tracker import the real
    ones. The launcher stands for the installed `gputune` script, which lives elsewhere."""
    here, bin_dir = tmp_path / "project", tmp_path / "bin"
    here.mkdir()
    bin_dir.mkdir()
    for name in ("multiprocessing", "pickle"):
        (here / f"{name}.py").write_text(
            f"import sys; open({str(tmp_path / ('ran-' + name))!r}, 'w').close(); sys.exit(7)\n")
    (bin_dir / "gputune").write_text(LAUNCHER)
    env = dict(_env(), GPUTUNE_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "pythonpath")])
    done = subprocess.run(
        [sys.executable, str(bin_dir / "gputune"), "bench", "--device", "cpu", "--workload",
         "tests.engine.user_workloads:no_first_batch"],
        capture_output=True, text=True, timeout=120, cwd=here, env=env)
    # The worker ran gputune's code: it loaded the workload and refused its first batch.
    assert done.returncode == 2 and "returned None" in done.stderr, done.stderr
    assert not list(tmp_path.glob("ran-*")), "a module of the current folder ran"


def test_the_import_path_handed_to_a_worker_ends_with_the_current_folder(tmp_path, monkeypatch):
    from tuner_tui.engine.client import clean_import_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), "/lib/a", "/lib/b"])
    with clean_import_path():
        assert sys.path == ["/lib/a", "/lib/b", "", str(tmp_path)]
        assert os.environ["PYTHONSAFEPATH"] == "1"
    assert sys.path == ["", str(tmp_path), "/lib/a", "/lib/b"]
    assert "PYTHONSAFEPATH" not in os.environ
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # put there by the user: left where it is
    with clean_import_path():
        assert sys.path == ["", str(tmp_path), "/lib/a", "/lib/b"]

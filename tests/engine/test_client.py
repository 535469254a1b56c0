"""The worker client's process hygiene, checked in a separate Python process (what a user's
terminal would show when gputune exits)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_killed_worker_leaves_no_leak_warning_in_the_terminal(tmp_path):
    assert "leaked semaphore" not in _stderr_after_a_killed_child(tmp_path, "as-client")


def test_without_the_client_setup_the_tracker_would_warn(tmp_path):
    # The case the setup exists for: without it, the warning reaches the terminal.
    assert "leaked semaphore" in _stderr_after_a_killed_child(tmp_path, "plain")

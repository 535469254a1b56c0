"""Ctrl-C and a closed terminal during `gputune bench`: one line, no worker tracebacks, no
processes or semaphores left behind. The terminal is played by a new session whose process
group gets the signal, as a terminal's line discipline (Ctrl-C) or a closing shell (SIGHUP)
sends it to the foreground job."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _semaphores() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sem.mp-")}


def _semaphores_of(processes) -> set[str]:
    """Named semaphores these processes hold open (mapped from /dev/shm): other programs on the
    machine may create their own meanwhile."""
    names = set()
    for process in processes:
        try:
            maps = Path(f"/proc/{process.pid}/maps").read_text()
        except OSError:
            continue
        names |= {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/dev/shm/sem.mp-" in line}
    return names


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_terminal_signal_during_bench(tmp_path, signum):
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPUTUNE_HOME=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner_tui.cli", "bench", "--device", "cpu", "--workload",
         "gpt2-tiny", "--steps", "500", "--warmup", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True,
    )
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(
        "spawn_main" in " ".join(p.cmdline()) for p in parent.children(recursive=True)
    ):
        time.sleep(0.2)
    time.sleep(4)  # into the worker's start or its first trial
    children = parent.children(recursive=True)
    assert children, "the bench started no worker"
    during = _semaphores_of([parent, *children])
    os.killpg(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["gputune: interrupted"], err
    assert "Traceback" not in err + out
    assert during, "the bench created no semaphore to leak"
    assert not (during & _semaphores()), "semaphores left in /dev/shm"

"""`gputune --device cpu` in a real terminal (tmux): figures appear at 160x48, 120x36 and 80x24
with no library warning over them, keys work, export writes a file that loads, `q` quits and
leaves no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import strategies

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

GPUTUNE = Path(sys.executable).with_name("gputune")


# pytest sets COLUMNS=80 and LINES=24, which Textual would take over the pane's real size.
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True, env=ENV).stdout


def wait_screen(session: str, predicate, timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if predicate(screen):
            return screen
        time.sleep(0.25)
    size = tmux("display-message", "-p", "-t", session, "#{window_width}x#{window_height}")
    raise AssertionError(f"{what} did not appear within {timeout}s; the {size.strip()} screen was:\n{screen}")


NOT_ON_SCREEN = ("Warning", "W1", "Failed to load", "Traceback")
"""What a worker or a library printed would look like over the dashboard."""


def assert_clean(screen: str, where: str) -> None:
    for line in screen.splitlines():
        for word in NOT_ON_SCREEN:
            assert word not in line, f"{word!r} on the screen at {where}:\n{screen}"


def resize(session: str, width: int, height: int) -> None:
    tmux("resize-window", "-t", session, "-x", str(width), "-y", str(height))


def family(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_gputune_in_a_terminal(tmp_path):
    if not GPUTUNE.exists():
        pytest.skip(f"{GPUTUNE} is not installed (pip install -e .)")
    session = f"gputune-test-{time.monotonic_ns()}"
    command = f"unset COLUMNS LINES; cd {tmp_path} && exec {GPUTUNE} --device cpu --workload gpt2-tiny"
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", command)
    seen: dict[int, psutil.Process] = {}
    try:
        pane_pid = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        # The baseline's leaderboard row: measured figures are on screen.
        screen = wait_screen(session, lambda s: " ok " in s and "×1.00" in s, 240, "the baseline row")
        seen.update({p.pid: p for p in family(pane_pid)})
        assert len(seen) >= 2, "expected gputune and its worker process"
        assert_clean(screen, "160x48")

        # The profile's verdict, then the same at 120x36 and 80x24: the current figures, the
        # leaderboard's status column and the verdict stay on screen.
        tmux("send-keys", "-t", session, "x")
        screen = wait_screen(session, lambda s: "-bound" in s, 120, "the profile's verdict")
        assert_clean(screen, "160x48 after x")
        for width, height in ((120, 36), (80, 24)):
            resize(session, width, height)
            screen = wait_screen(
                session, lambda s: "tokens/s " in s and "status" in s and " ok " in s
                and "-bound" in s and "×1.00" in s, 20, f"the figures at {width}x{height}")
            assert_clean(screen, f"{width}x{height}")

        tmux("send-keys", "-t", session, "p")
        wait_screen(session, lambda s: "paused" in s, 20, "the paused state")
        tmux("send-keys", "-t", session, "p")
        wait_screen(session, lambda s: "training" in s, 20, "training again")

        tmux("send-keys", "-t", session, "e")
        wait_screen(session, lambda s: "Export configuration" in s, 10, "the export dialog")
        tmux("send-keys", "-t", session, "Enter")
        exported = tmp_path / "gputune.toml"
        wait_screen(session, lambda s: exported.exists(), 10, "the exported file")
        assert strategies.load(exported) == strategies.TuneConfig()

        seen.update({p.pid: p for p in family(pane_pid)})
        tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and subprocess.run(
            ["tmux", "has-session", "-t", session], capture_output=True, env=ENV
        ).returncode == 0:
            time.sleep(0.2)
        _, alive = psutil.wait_procs(list(seen.values()), timeout=10)
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, env=ENV)
        for p in seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.mark.parametrize("how", ["ctrl+c", "sigterm", "closed terminal"])
def test_ctrl_c_and_sigterm_leave_no_process(tmp_path, how):
    if not GPUTUNE.exists():
        pytest.skip(f"{GPUTUNE} is not installed (pip install -e .)")
    session = f"gputune-test-{time.monotonic_ns()}"
    command = f"unset COLUMNS LINES; cd {tmp_path} && exec {GPUTUNE} --device cpu --workload gpt2-tiny"
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", command)
    seen: dict[int, psutil.Process] = {}
    try:
        pane_pid = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        wait_screen(session, lambda s: "training" in s, 240, "training")
        seen.update({p.pid: p for p in family(pane_pid)})
        assert len(seen) >= 2, "expected gputune and its worker process"
        if how == "ctrl+c":
            tmux("send-keys", "-t", session, "C-c")
        elif how == "sigterm":
            os.kill(pane_pid, signal.SIGTERM)
        else:  # the pane's processes get SIGHUP
            tmux("kill-session", "-t", session)
        _, alive = psutil.wait_procs(list(seen.values()), timeout=40)  # 2 busy cores in CI
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, env=ENV)
        for p in seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass

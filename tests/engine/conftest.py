import os
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


@pytest.fixture
def gputune():
    return run_gputune


"""The fused kernels' C++ build beside the search's trials (engine/native_build.py): a real
build process, ended in the middle as a search that ends early ends it. (The whole build, and
the trial that then loads it, are the GPU suite's: tests/kernels/test_native.py.)"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tuner_tui.engine.native_build import NativeBuild


def _group_ended(pgid: int, within_s: float = 5.0) -> bool:
    """Whether every process of group `pgid` has ended within `within_s` (an orphan killed is
    gone once its new parent reaps it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("c++") is None,
                    reason="torch's cpp_extension needs ninja and a C++ compiler")
def test_a_build_stopped_in_the_middle_ends_with_its_compiler_and_says_so(tmp_path):
    build = NativeBuild({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    pgid = build.process.pid
    deadline = time.monotonic() + 120
    # Until torch's build lock is taken: the compiler runs.
    while not list(tmp_path.glob("gputune_native_*/lock")) and time.monotonic() < deadline:
        assert build.process.poll() is None, "the build ended before it compiled"
        time.sleep(0.1)
    assert list(tmp_path.glob("gputune_native_*/lock"))
    [folder] = tmp_path.glob("gputune_native_*")
    assert _build_lock_held(folder)  # its own, that ends with it
    assert not build.poll()
    started = time.monotonic()
    summary = build.close()
    assert time.monotonic() - started < 10
    assert "was stopped after" in summary
    assert build.process.returncode is not None
    assert _group_ended(pgid)  # ninja and the compiler too
    assert not list(folder.glob("*.so"))  # (it was stopped before the end)
    assert not _build_lock_held(folder)  # the next build goes on at once


def _build_lock_held(folder) -> bool:
    import fcntl

    from gputune_kernels import _native

    with open(folder / _native.BUILD_LOCK, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def test_a_build_that_ends_says_how_it_went_and_in_how_long():
    """(GPUTUNE_NATIVE=0 ends it as soon as torch is imported: the words it ends with are
    those of a finished build.)"""
    build = NativeBuild({"GPUTUNE_NATIVE": "0"})
    deadline = time.monotonic() + 120
    while not build.poll() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert build.status == "off (GPUTUNE_NATIVE=0)"
    assert 0 < build.took_s < time.monotonic() - build.started
    assert build.close() == ("the fused kernels' C++ build beside the trials: "
                             f"off (GPUTUNE_NATIVE=0) after {build.took_s:.0f} s")

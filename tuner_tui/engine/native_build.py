"""The fused kernels' C++ nodes (`gputune_kernels._native`) built beside the search's first
trials, in a process of their own. Torch-free (the process imports torch, this module does not).

On a fresh machine the build takes 20-60 s (a C++ compile; once per source, torch and Python
version, then cached). Left to the first trial with fused kernels, it is charged to that trial:
on an H100 the expert's eager trial spent 24.7 s of its 43 s building (docs/search.md,
2026-12-06). Started with the search, it runs while the baseline trial runs, on a CPU core the
trials leave idle, at the lowest CPU priority; the trial that needs it waits only for what is
left (`_native.build_lock`), then loads the cached build.

The process is its own session, so a Ctrl-C reaches only gputune, which ends it in `close`. A
build ended in the middle leaves torch's lock behind; the next build clears it (its build lock
ended with the process, `_native.build_lock`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

BUILD = (
    "import os, time\n"
    "started = time.monotonic()\n"
    "os.nice(19)\n"
    "from gputune_kernels import _native\n"
    "status = _native.wait()\n"
    "print(f'{time.monotonic() - started:.1f} {status}', flush=True)\n"
)
"""The build process's program: build (or load the cached build), then say in how long (its
own count: the search reads it only at its end) and how it went."""


class NativeBuild:
    """One build process, started now with `environ` added to this process's environment (the
    workers' own additions, so that it builds where they will look)."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = {**os.environ, **(environ or {}), "PYTHONSAFEPATH": "1"}
        self.started = time.monotonic()
        self.ended = False
        self.took_s: float | None = None
        """Seconds the build took, as it said (None: not ended, or ended without a word)."""
        self.status = "building"
        """What `_native.wait` said ('ready', 'unavailable: why', ...), once it ended."""
        self.process = subprocess.Popen(
            [sys.executable, "-c", BUILD], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)

    def poll(self) -> bool:
        """Whether the build has ended (its status and time then read)."""
        if self.ended:
            return True
        code = self.process.poll()
        if code is None:
            return False
        self.ended = True
        out = (self.process.stdout.read() if self.process.stdout else "").strip()
        took, _, status = (out.splitlines()[-1] if out else "").partition(" ")
        try:
            self.took_s = float(took)
            self.status = status[:300]
        except ValueError:  # (it died before it could say)
            self.status = f"ended with exit code {code}"
        return True

    def summary(self) -> str:
        if self.poll():
            return "the fused kernels' C++ build beside the trials: " + self.status + (
                f" after {self.took_s:.0f} s" if self.took_s is not None else "")
        return f"the fused kernels' C++ build beside the trials was stopped after " \
               f"{time.monotonic() - self.started:.0f} s (the next build takes it up)"

    def close(self) -> str:
        """End the process if it still builds (the search is over); what became of it."""
        summary = self.summary()
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
            # The compiler and ninja, its children, end with it (a build left running would
            # finish, but nothing gputune started outlives it). Their group's id cannot have
            # gone to another process while one of them lives.
            self._signal(signal.SIGKILL)
        if self.process.stdout:
            self.process.stdout.close()
        return summary

    def _signal(self, sig: int) -> None:
        """`sig` to the process and every process of its session (its own group)."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):  # (all ended already)
            pass

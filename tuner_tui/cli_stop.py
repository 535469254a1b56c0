"""How `gputune` stops on an interrupt (Ctrl-C, SIGTERM, a closed terminal): a
KeyboardInterrupt, so that every `finally` stops its workers in order, with a watchdog that
kills them and exits 130 if that order takes too long. Imports no torch (nor psutil, until the
watchdog needs it)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

STOP_WATCHDOG_S = 30.0
"""After an interrupt, the orderly stop (each worker asked, then terminated, then killed: a few
seconds each) gets this long; past it, a watchdog kills the workers and gputune exits 130 (a
CI run once saw gputune sleep for a minute after Ctrl-C on a loaded host)."""
_watchdog: threading.Timer | None = None


def _stop_by_force() -> None:
    with contextlib.suppress(Exception):
        import psutil  # (here: the CLI itself imports nothing outside the standard library)

        children = psutil.Process().children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        # a kill is delivered, not done: wait (briefly) so no worker outlives gputune's exit
        psutil.wait_procs(children, timeout=3)
    with contextlib.suppress(Exception):
        print(f"gputune: the workers did not stop within {STOP_WATCHDOG_S:.0f} s of the "
              "interrupt: killed", file=sys.stderr)
        print("gputune: interrupted", file=sys.stderr)
        sys.stderr.flush()
    os._exit(130)


def cancel_watchdog() -> None:
    """The orderly stop ended: the watchdog has nothing to do."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.cancel()
        _watchdog = None


def _raise_interrupt(signum, frame):
    global _watchdog
    if _watchdog is None:
        _watchdog = threading.Timer(STOP_WATCHDOG_S, _stop_by_force)
        _watchdog.daemon = True
        _watchdog.start()
    raise KeyboardInterrupt


def install_handlers() -> None:
    """SIGTERM and SIGHUP (the terminal closed) take the same path as Ctrl-C, so `finally`
    blocks stop the worker processes and multiprocessing removes its semaphores. A SIGHUP the
    user ignored (`nohup gputune tune ...`) stays ignored, so the search outlives the terminal,
    as a SIGINT ignored by the shell (a background job) does."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    for signum in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise_interrupt)

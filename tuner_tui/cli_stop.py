"""How `gputune` stops on an interrupt (Ctrl-C, SIGTERM, a closed terminal): a
KeyboardInterrupt, so that every `finally` stops its workers in order, with a watchdog that
kills them and exits 130 if that order takes too long, and an interrupt that Python swallowed
(raised in a __del__ or a weakref callback) sent again. Imports no torch (nor psutil, until the
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
INTERRUPT_AGAIN_S = 0.01
"""How long after an interrupt that Python swallowed it is sent again."""
_interrupted_by: int | None = None
"""The signal that interrupted this run (None: none has)."""


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
    global _watchdog, _interrupted_by
    _interrupted_by = signum
    if _watchdog is None:
        _watchdog = threading.Timer(STOP_WATCHDOG_S, _stop_by_force)
        _watchdog.daemon = True
        _watchdog.start()
    raise KeyboardInterrupt


def _interrupt_again_if_swallowed(unraisable) -> None:
    """sys.unraisablehook. Python runs a signal's handler wherever the main thread is, even in
    a weakref callback or a __del__, where an exception cannot be passed on: it prints
    "Exception ignored" and goes on. An interrupt raised there would be lost (seen on the CPU:
    in importlib's module-lock callback, the search went on until the watchdog ended it 30 s
    later, with nothing written). The signal is sent again, a moment later from a thread, so
    that its handler runs at a point of the main thread that can take the exception."""
    if unraisable.exc_type is not KeyboardInterrupt or _interrupted_by is None:
        sys.__unraisablehook__(unraisable)
        return
    while True:
        try:
            again = threading.Timer(INTERRUPT_AGAIN_S, signal.raise_signal, (_interrupted_by,))
            again.daemon = True
            again.start()
            return
        except KeyboardInterrupt:  # it came before this hook ended, where it would be lost too
            continue


def install_handlers() -> None:
    """SIGTERM and SIGHUP (the terminal closed) take the same path as Ctrl-C, so `finally`
    blocks stop the worker processes and multiprocessing removes its semaphores. A SIGHUP the
    user ignored (`nohup gputune tune ...`) stays ignored, so the search outlives the terminal,
    as a SIGINT ignored by the shell (a background job) does."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    for signum in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise_interrupt)
    sys.unraisablehook = _interrupt_again_if_swallowed

"""The user's code run under a time limit in the worker: a workload's function and its first
batch. A Python call cannot be interrupted from outside, and a hung worker must not hang
gputune, so past the limit the process reports what it waited for, and where that code was, and
exits. Imports no torch.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Callable, TypeVar

from tuner_tui.engine import protocol
from tuner_tui.engine.kernel_knobs import WORKLOAD_TIMEOUT_ENV, workload_timeout_s

T = TypeVar("T")


def within_limit(what: str, work: Callable[[], T], events) -> T:
    """`work()` under $GPUTUNE_WORKLOAD_TIMEOUT; past it, a RunFailed naming `what` goes to
    `events` (the worker's event queue) and the process exits with code 3."""
    limit = workload_timeout_s()
    waiting = threading.get_ident()
    done = threading.Event()

    def watch() -> None:
        if done.wait(limit):
            return
        frame = sys._current_frames().get(waiting)
        where = ""
        if frame is not None:
            top = traceback.extract_stack(frame)[-1]
            where = f" (it was at {top.filename}:{top.lineno} in {top.name})"
        events.put(protocol.RunFailed(0, "invalid", f"{what} did not return within {limit:g} s"
                                      f"{where}; {WORKLOAD_TIMEOUT_ENV} sets the limit"))
        if hasattr(events, "join_thread"):  # let the event reach the parent
            events.close()
            events.join_thread()
        os._exit(3)

    threading.Thread(target=watch, name="gputune-workload-timeout", daemon=True).start()
    try:
        return work()
    finally:
        done.set()

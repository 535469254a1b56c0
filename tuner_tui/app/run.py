"""Running the dashboard as the `gputune` command: the worker's log file, the result store,
and an orderly exit on SIGTERM and SIGHUP."""

from __future__ import annotations

import threading
import time
from typing import Any

from strategies.config import TuneConfig
from tuner_tui.app.app import GputuneApp


EXIT_GRACE_S = 5.0
"""After SIGTERM or SIGHUP, how long the app may take to exit in order before it is ended."""


def run_dashboard(spec: Any, start_config: TuneConfig | None = None,
                  memory_budget: int | None = None) -> int:
    """Open the dashboard on a worker built from `spec` (a `WorkerSpec`); returns the exit code."""
    import os
    import signal

    from dataclasses import replace

    from tuner_tui.engine.client import WorkerClient
    from tuner_tui.engine.worker_log import new_run_log

    if spec.log_path is None:  # the worker's output must not reach the screen
        spec = replace(spec, log_path=str(new_run_log("dashboard")))
    subtitle = f"{spec.workload} · {spec.device}"
    app = GputuneApp(lambda: WorkerClient(spec), start_config, subtitle=subtitle,
                     memory_budget=memory_budget, log_path=spec.log_path, record=True)

    def on_sigterm(signum: int, frame: Any) -> None:
        # Runs in the main thread between bytecodes; exit through the app's loop.
        app.call_later(app.exit, 0)
        if not forced.is_set():
            forced.set()
            threading.Thread(target=exit_if_stuck, args=(signum,), daemon=True).start()

    def exit_if_stuck(signum: int) -> None:
        """A closed terminal can leave the app unable to finish its orderly exit (seen: still
        alive, with its worker, 40 s after SIGHUP). After a grace period the worker is stopped
        from here and the process ends, so nothing is left behind."""
        time.sleep(EXIT_GRACE_S)
        if app.reader is not None:
            app.reader.close(timeout=2.0)
        os._exit(128 + signum)

    forced = threading.Event()

    previous = {s: signal.signal(s, on_sigterm) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = app.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if app.reader is not None:
            app.reader.close()
    return 0 if code is None else int(code)

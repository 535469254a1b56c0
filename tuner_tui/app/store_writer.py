"""The dashboard's rows into the result store, in a thread of their own (SQLite may wait on
another process's lock), so that `h` lists them beside what `bench` and `tune` measured."""

from __future__ import annotations

import queue
import threading
from typing import Any


class StoreWriter:
    """`record(result, environment, workload, steps, source)` queues a row; `close()` writes
    what is queued and stops. Problems with the store go to `on_problem` (the log view)."""

    def __init__(self, on_problem, path: Any = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._on_problem = on_problem
        self._path = path
        self._thread = threading.Thread(target=self._run, name="gputune-store", daemon=True)
        self._thread.start()

    def record(self, result, environment: dict, workload: dict, steps: int, warmup_steps: int,
               source: str) -> None:
        self._queue.put((result, dict(environment), dict(workload), steps, warmup_steps, source))

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        from tuner_tui.engine.store import ResultStore, StoreError, workload_key

        store = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            result, environment, workload, steps, warmup, source = item
            if not workload.get("name"):
                continue
            try:
                if store is None:
                    store = ResultStore(self._path, on_problem=self._on_problem)
                store.record(result, environment, workload_key(workload), steps, warmup,
                             source=source)
            except StoreError as exc:
                self._on_problem(str(exc))
            except Exception as exc:  # noqa: BLE001 - the store must never take the dashboard down
                self._on_problem(f"result store: {type(exc).__name__}: {exc}")
        if store is not None:
            store.close()

"""The thread between the worker process and the UI.

It owns the event source (a `WorkerClient`, or a fake in tests): starts it, waits on its events
and its process sentinel, and hands events to the app in order. Events are queued, and a single
`EventsReady` message is posted whenever the queue goes from empty to non-empty, so a flood of
`StepMeasured` costs the UI one wake-up per batch rather than one per step. A dead source is
reported (`WorkerExited`) within a sentinel wait (0.25 s) and restarted, unless it keeps dying.
`WorkerStarted` and `WorkerExited` travel in the same queue as the worker's events, so the UI
sees a death after the dead worker's last event and before its successor's first.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from textual.message import Message

from tuner_tui.engine.protocol import StepMeasured, StepPart, WorkerReady

RESTART_LIMIT = 3
"""Deaths within RESTART_WINDOW_S after which the reader stops restarting the worker."""
RESTART_WINDOW_S = 60.0
WAIT_S = 0.25
FLUSH_S = 0.05
"""Step events are handed to the UI at most this often (20 times a second)."""
CHILDREN_EVERY_S = 1.0
"""How often the worker's child processes are listed, so they can be reaped if it dies."""


class EventSource(Protocol):
    """What the reader needs from a worker; `WorkerClient` has it, tests pass a fake."""

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None: ...

    def send(self, command: Any) -> None: ...

    def wait_event(self, timeout: float) -> Any | None: ...

    def is_alive(self) -> bool: ...

    def exitcode(self) -> int | None: ...

    def stop(self, timeout: float = 5.0) -> None: ...


class EventsReady(Message):
    """Worker events are waiting in the reader: call `EventReader.take()`."""


class WorkerStarted:
    """A worker process started; queued with the events so that it is handled in order."""

    def __init__(self, pid: int | None, restart: bool) -> None:
        self.pid = pid
        self.restart = restart


class WorkerExited:
    """The worker process is gone; queued with the events, after whatever it sent before dying
    and before anything its successor sends (posted apart, it could reach the UI after the next
    worker's WorkerReady, and the death would be counted against the wrong configuration)."""

    def __init__(self, pid: int | None, exitcode: int | None, restarting: bool, reason: str = "") -> None:
        self.pid = pid
        self.exitcode = exitcode
        self.restarting = restarting
        self.reason = reason


@contextlib.contextmanager
def _process_stderr():
    """Inside a running Textual app sys.stderr is a capture object whose fileno() is -1; the
    first multiprocessing Queue starts the resource tracker, which passes that fd on and fails
    ("bad value(s) in fds_to_keep"). Creating the worker with the real stderr avoids it."""
    saved = sys.stderr
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


def _descendants(pid: int | None) -> list:
    """The worker's child processes (torch.compile's compile workers), to reap after it stops."""
    if pid is None:
        return []
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:
        return []


def _reap(processes: list) -> None:
    """Terminate, then kill, whatever of `processes` outlived the worker."""
    if not processes:
        return
    import psutil

    alive = [p for p in processes if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=2.0)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


class EventReader(threading.Thread):
    """Run with `start()`; send commands with `send()` from the UI thread; `close()` stops the
    worker and the thread (idempotent)."""

    def __init__(
        self,
        source_factory: Callable[[], EventSource],
        post: Callable[[Message], Any],
        auto_restart: bool = True,
    ) -> None:
        super().__init__(name="gputune-reader", daemon=True)
        self._factory = source_factory
        self._post = post
        self.auto_restart = auto_restart
        self._lock = threading.Lock()
        self._events: deque = deque()
        self._notified = False
        self._stopping = threading.Event()
        self._source: EventSource | None = None
        self._source_lock = threading.Lock()
        self._deaths: deque[float] = deque()
        self._closed = False
        self._ready = False
        self._manual_restart = threading.Event()
        self._restart_requested = False
        self._children: list = []
        self._children_at = 0.0
        self._last_post = 0.0

    # -- UI side ---------------------------------------------------------------------------------
    def take(self) -> list:
        """All queued events, oldest first."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            self._notified = False
        return events

    def send(self, command: Any) -> bool:
        """Send a command to the current worker; False when there is none to take it."""
        with self._source_lock:
            source = self._source
            if source is None or not source.is_alive():
                return False
            try:
                source.send(command)
            except Exception:
                return False
        return True

    @property
    def pid(self) -> int | None:
        source = self._source
        return source.pid if source is not None else None

    def restart_worker(self) -> None:
        """Ask for a fresh worker (the current one is stopped); the loop notices and restarts."""
        self._deaths.clear()
        self._restart_requested = True
        self._manual_restart.set()
        with self._source_lock:
            source = self._source
        if source is not None:
            source.stop(timeout=2.0)

    def close(self, timeout: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)
        # If the thread never ran or is stuck, stop the worker from here.
        with self._source_lock:
            source = self._source
            self._source = None
        if source is not None:
            self._stop_source(source)

    # -- reader thread ---------------------------------------------------------------------------
    def _deliver(self, event: Any) -> None:
        if isinstance(event, WorkerReady):
            self._ready = True
        with self._lock:
            self._events.append(event)
        # Steps (and their parts) wait up to FLUSH_S for company; anything else goes to the UI
        # at once.
        self._flush(force=not isinstance(event, (StepMeasured, StepPart)))

    def _flush(self, force: bool = False) -> None:
        """Post one EventsReady for whatever is queued, unless one is already on its way."""
        now = time.monotonic()
        with self._lock:
            due = force or now - self._last_post >= FLUSH_S
            notify = bool(self._events) and not self._notified and due
            if notify:
                self._notified = True
                self._last_post = now
        if notify:
            self._post(EventsReady())

    @property
    def _pending(self) -> bool:
        with self._lock:
            return bool(self._events) and not self._notified

    def _start_source(self, restart: bool) -> EventSource:
        self._ready = False
        source = self._factory()
        with _process_stderr():
            source.start()
        with self._source_lock:
            self._source = source
        self._deliver(WorkerStarted(source.pid, restart))
        return source

    def _stop_source(self, source: EventSource, timeout: float = 5.0) -> None:
        """Stop the worker and reap its children: those seen while it lived (a dead worker's
        children are no longer its children) and those it has now."""
        children = {p.pid: p for p in self._children + _descendants(source.pid)}
        self._children = []
        try:
            source.stop(timeout=timeout)
        finally:
            _reap(list(children.values()))

    def _watch_children(self, source: EventSource) -> None:
        now = time.monotonic()
        if now - self._children_at >= CHILDREN_EVERY_S:
            self._children_at = now
            self._children = _descendants(source.pid)

    def _should_restart(self) -> bool:
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
            self._deaths.popleft()
        return self.auto_restart and len(self._deaths) < RESTART_LIMIT

    def _start_or_report(self, restart: bool) -> EventSource | None:
        """Start a worker; on failure say why and wait for a manual restart (or the end)."""
        while not self._stopping.is_set():
            try:
                return self._start_source(restart)
            except Exception as exc:  # the worker could not even be spawned
                reason = f"could not start the worker: {type(exc).__name__}: {exc}"
                self._deliver(WorkerExited(None, None, False, reason))
            if not self._wait_for_manual_restart():
                return None
        return None

    def _wait_for_manual_restart(self) -> bool:
        """Block until restart_worker() is called (True) or the reader is closed (False)."""
        while not self._stopping.is_set() and not self._manual_restart.wait(0.25):
            pass
        self._manual_restart.clear()
        self._restart_requested = False
        return not self._stopping.is_set()

    def run(self) -> None:
        source = self._start_or_report(restart=False)
        if source is None:
            return
        try:
            while not self._stopping.is_set():
                try:
                    event = source.wait_event(FLUSH_S if self._pending else WAIT_S)
                except (OSError, ValueError, EOFError):
                    # The queues were closed under us (a restart request stopped the source).
                    event = None
                    time.sleep(0.05)
                if event is not None:
                    self._deliver(event)
                    continue
                self._flush(force=True)
                if self._stopping.is_set():
                    continue
                if source.is_alive():
                    self._watch_children(source)
                    continue
                # Dead: whatever it sent before dying has been drained by wait_event.
                if self._restart_requested:
                    self._restart_requested = False
                    restart, reason = True, "restart requested"
                elif not self._ready:
                    # It never got as far as WorkerReady (bad workload, device, data): a new
                    # one would fail the same way.
                    restart, reason = False, "the worker exited before it was ready; not restarting it"
                else:
                    restart = self._should_restart()
                    reason = "" if restart or not self.auto_restart else (
                        f"the worker died {RESTART_LIMIT} times within {RESTART_WINDOW_S:.0f} s; "
                        "not restarting it (ctrl+r restarts it)"
                    )
                self._manual_restart.clear()
                self._deliver(WorkerExited(source.pid, source.exitcode(), restart, reason))
                with self._source_lock:
                    self._source = None
                self._stop_source(source, timeout=1.0)
                if not restart and not self._wait_for_manual_restart():
                    return
                source = self._start_or_report(restart=True)
                if source is None:
                    return
        finally:
            with self._source_lock:
                current, self._source = self._source, None
            if current is not None:
                self._stop_source(current)


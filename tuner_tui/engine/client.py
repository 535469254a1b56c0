"""The parent's handle on a worker process: start it, send commands, read events, notice death.

Torch-free: the dashboard and `gputune bench` both drive workers through this class, and only the
child process imports torch (CUDA cannot be forked, so the child is spawned).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import wait

from tuner_tui.engine import protocol
from tuner_tui.engine.protocol import WorkerSpec


def _worker_entry(spec: WorkerSpec, commands, events, quiet) -> None:
    # Its own process group: Ctrl-C and a closed terminal reach only the parent, which stops
    # the worker (and with it the compile workers) in order, with no tracebacks from them.
    os.setpgrp()
    # Started with SIGINT blocked (`WorkerClient.start`), so that a Ctrl-C during the spawn's
    # imports prints no traceback from this child: one that came meanwhile is dropped, then
    # SIGINT acts as usual (only the parent, in the terminal's process group, gets Ctrl-C now).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update(dict(spec.environ))
    # Imported here, in the child, so that the parent never imports torch.
    from tuner_tui.engine.worker import run_worker

    run_worker(spec, commands, events, quiet)


_STDERR_SWAP = threading.RLock()
"""Workers are spawned from more than one thread (the optimizer steps' worker starts again from
its own): one swap of sys.stderr at a time, or one could put back the other's."""


@contextlib.contextmanager
def _real_stderr():
    """Inside a running Textual app sys.stderr is a capture object whose fileno() is -1, and
    multiprocessing's resource tracker passes that fd to the child ("bad value(s) in
    fds_to_keep"). Spawning with the process's real stderr avoids it."""
    with _STDERR_SWAP:
        saved = sys.stderr
        real = sys.__stderr__
        try:
            if real is not None:
                sys.stderr = real
            yield
        finally:
            sys.stderr = saved


TRACKER_LEAK_WARNING = "ignore:resource_tracker:UserWarning"
"""A -W option for multiprocessing's resource tracker process. A worker killed mid-compile
(SIGKILL, a segfault, OOM killer) cannot unregister the semaphores of Inductor's compile pool;
the tracker then cleans them up, as it should, but also prints a warning about "leaked
semaphore objects" into the user's terminal when gputune exits. The tracker is started with the
parent's -W options (sys.warnoptions), so the option has to be there before it starts."""


def _quiet_resource_tracker() -> None:
    if TRACKER_LEAK_WARNING not in sys.warnoptions:
        sys.warnoptions.append(TRACKER_LEAK_WARNING)
    # The tracker ignores SIGINT and SIGTERM but not SIGHUP: when the terminal closes it would
    # die before the parent unlinks its semaphores. Started with SIGHUP blocked (the mask is
    # inherited through fork and exec), it outlives the parent's clean-up.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def clean_import_path():
    """While child processes start (the worker, multiprocessing's resource tracker): no
    folder of the parent's current folder is first on their import path, so that a
    `multiprocessing.py` or `pickle.py` lying there is never run. Both are started with
    `python -c`, which puts the current folder first: PYTHONSAFEPATH=1 (inherited, also by the
    worker's own children) leaves it out; and the import path the worker is handed (spawn's
    preparation data, a copy of sys.path) has the current folder moved to the end, where a
    user's `module:function` is still found (cli.check_run_options puts it there). A folder
    the user put on PYTHONPATH stays where they put it."""
    here = os.path.realpath(os.getcwd())
    explicit = {os.path.realpath(p)
                for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    saved_path, saved_env = list(sys.path), os.environ.get("PYTHONSAFEPATH")
    current = [] if here in explicit else [
        p for p in saved_path if os.path.realpath(p or ".") == here]
    sys.path[:] = [p for p in saved_path if p not in current] + current
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = saved_env


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _interrupts_held():
    """While a worker is spawned from the main thread, the Python handlers of the stopping
    signals only note a signal; the first noted is handled once the spawn is done. Blocking
    SIGINT in this thread (`WorkerClient.start`) does not hold them: another thread of the
    process (a queue's feeder, a watcher) takes the signal, and Python then runs its handler
    in the main thread at its next bytecode, mid-spawn. A KeyboardInterrupt raised there, after
    the child was forked and before `Process.start` kept its handle, left a child that no one
    ended, reading half its start-up data: "EOFError: Ran out of input" from
    multiprocessing's spawn_main on the user's terminal (on the CPU, of 60 spawns interrupted
    at random, 39 left their child so and 31 printed it). Handled after the spawn, the
    interrupt reaches the caller's `except BaseException`, which ends the child."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (handlers run in the main thread only: this thread's spawn is not interrupted)
        return
    noted: list[tuple[int, object]] = []
    saved: dict[int, object] = {}
    try:
        for signum in HELD_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                saved[signum] = handler
                signal.signal(signum, lambda signum, frame: noted.append((signum, frame)))
        yield
    finally:
        raised: BaseException | None = None
        for signum, handler in saved.items():
            while True:  # every handler put back, even where one put back already raises
                try:
                    signal.signal(signum, handler)
                    break
                except KeyboardInterrupt as exc:  # (signal.signal runs pending handlers first)
                    raised = exc
        if raised is not None:
            raise raised
        if noted:
            signum, frame = noted[0]
            saved[signum](signum, frame)


class WorkerClient:
    """One worker process. Not thread-safe: use it from one thread (the UI's reader thread or the
    bench loop)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._ctx = mp.get_context("spawn")
        self.process: mp.process.BaseProcess | None = None
        self.commands = None
        self.events = None
        self.quiet = None
        """Clear it to hold a trial's measured steps (`hold_measurement`); set by default."""
        self._holds = 0
        self._holds_lock = threading.Lock()

    def start(self) -> None:
        with _interrupts_held():
            self._start()

    def _start(self) -> None:
        # The first Queue starts multiprocessing's resource tracker, which passes stderr's fd
        # to its child: create the queues with the real stderr too.
        with _real_stderr(), clean_import_path():
            _quiet_resource_tracker()
            self.commands = self._ctx.Queue()
            self.events = self._ctx.Queue()
            self.quiet = self._ctx.Event()
        self.quiet.set()
        self.process = self._ctx.Process(
            target=_worker_entry,
            args=(self.spec, self.commands, self.events, self.quiet),
            name="gputune-worker",
            daemon=True,
        )
        # SIGINT blocked while the worker starts (the mask is inherited through fork and exec):
        # until its entry point moves it out of the terminal's process group, a Ctrl-C would
        # interrupt its imports with a traceback. The parent handles a Ctrl-C of that moment
        # once the spawn is done (`_interrupts_held`).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with _real_stderr(), clean_import_path():
                self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def hold_measurement(self) -> None:
        """A trial sent from now on waits after its warm-up until each hold is released
        (`release_measurement`): another worker starting, or two."""
        if self.quiet is not None:
            with self._holds_lock:
                self._holds += 1
                self.quiet.clear()

    def release_measurement(self) -> None:
        if self.quiet is not None:
            with self._holds_lock:
                self._holds = max(0, self._holds - 1)
                if not self._holds:
                    self.quiet.set()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def exitcode(self) -> int | None:
        return self.process.exitcode if self.process else None

    def send(self, command: protocol.Command) -> None:
        if self.commands is None:
            raise RuntimeError("worker not started")
        self.commands.put(command)

    def poll(self, timeout: float = 0.0) -> protocol.Event | None:
        """The next event, or None if none came within `timeout` seconds."""
        if self.events is None:
            return None
        try:
            return self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            return None

    def wait_event(self, timeout: float) -> protocol.Event | None:
        """Wait for an event or for the process to die, whichever comes first."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.poll()
            if event is not None:
                return event
            if not self.is_alive():
                # Drain what the worker managed to send before it died.
                return self.poll(timeout=0.2)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            assert self.process is not None
            wait([self.process.sentinel, self.events._reader], timeout=min(remaining, 0.25))

    def end_now(self) -> None:
        """Terminate the worker without asking (one still starting cannot be asked), then kill
        it if it lingers."""
        if self.process is None or not self.process.is_alive():
            return
        self.process.terminate()
        self.process.join(2.0)
        if self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(2.0)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to shut down; terminate, then kill, if it does not."""
        if self.process is None:
            return
        if self.process.is_alive():
            with contextlib.suppress(Exception):
                self.send(protocol.Shutdown())
            self.process.join(timeout)
        self.end_now()
        for q in (self.commands, self.events):
            if q is not None:
                q.close()
                q.cancel_join_thread()

"""Running one trial in a worker process: start a worker, give the next trial's worker a head
start, send a `RunTrial` and collect its result.

`bench` and `tune` both run their trials through here. Torch-free: the worker processes import
torch, the parent does not.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import kernel_knobs, protocol
from tuner_tui.engine.client import WorkerClient
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.step_pace import STILL_STEPPING, StepPace

NO_RESULT = "no result within"
"""How the message of a trial stopped at its timeout begins."""


def gave_no_result(result: protocol.TrialResult) -> bool:
    """Whether the trial was stopped at its timeout before it gave a result."""
    return result.status == "crash" and result.message.startswith(NO_RESULT)


def stopped_while_stepping(result: protocol.TrialResult) -> bool:
    """Whether it was stopped with its steps still coming: too slow for its limit, not hung."""
    return gave_no_result(result) and STILL_STEPPING in result.message


def died(exitcode: int | None) -> str:
    """The message of a trial whose worker died under it. A SIGKILL is named as what it most
    often is: Gemma 3's shape at batch 32 on a 23-GiB CPU machine read only "exit code -9",
    twice, where the kernel's out-of-memory killer had ended it."""
    text = f"the worker process died (exit code {exitcode})"
    if exitcode == -9:
        text += ": killed (SIGKILL), on Linux most often by the kernel's out-of-memory killer"
    return text


@dataclass(frozen=True)
class TrialPlan:
    """How long one trial runs: measured steps after the warm-up, and a wall-clock limit."""

    steps: int = 20
    warmup_steps: int = 5
    trial_timeout_s: float = 900.0
    """When a trial that gave no result is stopped (as hung), unless its steps still come
    (`limit_s`)."""
    profile_steps: int = 0
    """Steps profiled after the measured ones (0: no profile)."""
    trace_path: str | None = None
    limit_s: float | None = None
    """How long a trial whose steps still come may run, where those left fit within it
    (`step_pace.py`; None: not past `trial_timeout_s`)."""


def trace_path(trace_dir: str | None, index: int, config: TuneConfig) -> str | None:
    """Where a trial's profiler trace goes: numbered, named by the configuration."""
    if not trace_dir:
        return None
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", config.label()).strip("-") or "config"
    return str(Path(trace_dir) / f"{index:02d}-{slug}.json")


class WorkerStartError(Exception):
    """The worker could not build the workload (bad --workload or --data): a user error."""


def start_timeout_s() -> float:
    """How long a worker may take to be ready: importing torch and starting the device, then
    the workload's function and first batch, which the worker itself times
    (kernel_knobs.workload_timeout_s) so that it can say what it waited for."""
    return kernel_knobs.workload_timeout_s() + 120.0


def wait_ready(client: WorkerClient, timeout: float) -> protocol.Event | None:
    """The started worker's `WorkerReady`, or its `RunFailed`, or None if neither came (each
    wait up to `timeout`) before it went quiet or died."""
    event = client.wait_event(timeout)
    while event is not None and not isinstance(event, (protocol.WorkerReady,
                                                       protocol.RunFailed)):
        event = client.wait_event(timeout)
    return event


def pair_label(pair: tuple[str, str]) -> str:
    """A (weights, optimizer_state) pair of torchao's steps, as the report names it."""
    return f"{pair[0]} weights + {pair[1]} state"


def start_worker(spec: WorkerSpec,
                 timeout: float | None = None) -> tuple[WorkerClient, protocol.WorkerReady]:
    timeout = start_timeout_s() if timeout is None else timeout
    client = WorkerClient(spec)
    try:
        client.start()
        event = wait_ready(client, timeout)
    except BaseException:  # interrupted while it starts: ended here, not left to the exit
        client.end_now()
        raise
    if isinstance(event, protocol.WorkerReady):
        return client, event
    hung = client.is_alive()
    client.stop()
    if isinstance(event, protocol.RunFailed):
        raise WorkerStartError(event.message)
    if hung:
        raise WorkerStartError(f"the worker was not ready within {timeout:.0f} s (it imports "
                               f"torch, starts the {spec.device} device and loads the workload "
                               f"{spec.workload!r}); it was stopped")
    # (what it printed as it died is in the run's log, shared with the run's other workers)
    raise WorkerStartError(f"the worker did not start (exit code {client.exitcode()})"
                           + (f"; its output is in {spec.log_path}" if spec.log_path else ""))


class NextWorker:
    """Starts the next trial's worker while the current trial builds, compiles and warms up.

    A worker's start (importing torch, creating a CUDA context, building the workload) costs
    seconds; a trial runs in a fresh process, so without this every trial pays it in turn.
    The current trial's measured steps are held (`WorkerClient.hold_measurement`) until the
    next worker is up, so that no process start overlaps a measurement."""

    def __init__(self, spec: WorkerSpec, start_timeout: float | None = None) -> None:
        self.spec = spec
        self.start_timeout = start_timeout_s() if start_timeout is None else start_timeout
        self._client: WorkerClient | None = None
        self._thread: threading.Thread | None = None
        self._ready: protocol.WorkerReady | None = None

    def begin(self, current: WorkerClient) -> None:
        """Start the next worker; `current`'s measured steps wait until it is up (or failed)."""
        self.close()
        current.hold_measurement()
        client = WorkerClient(self.spec)
        try:
            client.start()
        except Exception:  # no head start then: `take` starts one the usual way and says why
            current.release_measurement()
            return
        except BaseException:  # interrupted as it spawned: ended here, not left to the exit
            client.end_now()
            current.release_measurement()
            raise
        self._client, self._ready = client, None

        def watch() -> None:
            try:
                event = wait_ready(client, self.start_timeout)
                if isinstance(event, protocol.WorkerReady):
                    self._ready = event
            finally:
                current.release_measurement()

        self._thread = threading.Thread(target=watch, name="gputune-next-worker", daemon=True)
        self._thread.start()

    def keep(self, client: WorkerClient, ready: protocol.WorkerReady) -> None:
        """Hold a worker that is already up, for the next `take`."""
        self.close()
        self._client, self._ready = client, ready

    def is_ready(self) -> bool:
        return self._ready is not None

    def take(self) -> tuple[WorkerClient, protocol.WorkerReady]:
        """The worker started by `begin`, once ready; a fresh one if none was started or it
        failed to start."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        client, ready = self._client, self._ready
        self._client = self._ready = None
        if client is not None and ready is not None and client.is_alive():
            return client, ready
        if client is not None:
            client.stop()
        return start_worker(self.spec, self.start_timeout)

    def close(self) -> None:
        """Stop a worker started and not taken; one still starting is ended, not waited for
        (under load a start takes tens of seconds, and an interrupted run has 30 to stop)."""
        if self._thread is not None:
            if self._thread.is_alive() and self._client is not None:
                self._client.end_now()
            # Not waited for past a few seconds: a worker killed in the middle of sending an
            # event leaves half a message in the pipe, and the watcher's read of it never ends
            # (a daemon thread: it ends with gputune).
            self._thread.join(timeout=3.0)
            self._thread = None
        if self._client is not None:
            self._client.stop()
        self._client = self._ready = None


def hold_measurement_while(current: WorkerClient, wait: Callable[[], object]) -> None:
    """`current`'s measured steps wait until `wait()` returns, run in a thread of its own (a
    worker starting or ending beside the trial)."""
    current.hold_measurement()

    def release() -> None:
        try:
            wait()
        finally:
            current.release_measurement()

    threading.Thread(target=release, name="gputune-hold", daemon=True).start()


class EndingWorker:
    """Stops the last trial's worker in the background, so that its exit (its compile workers'
    shutdown, the CUDA context's teardown: 0.8-0.9 s eager and 1.1-1.7 s after a compile on 2
    CPU cores, `benchmarks/worker_exit_cpu.py`) overlaps the next trial's build and first step
    instead of adding to every trial.
    The next trial's measured steps wait until it has exited (`hold`), as they wait for a
    start. Its memory is mostly gone by then: a worker frees its run's tensors as it reports."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def end(self, client: WorkerClient) -> None:
        """Stop `client` in the background (after the one before it, if that still ends)."""
        self.wait()
        self._thread = threading.Thread(target=client.stop, name="gputune-ending", daemon=True)
        self._thread.start()

    def hold(self, current: WorkerClient) -> None:
        """`current`'s measured steps wait until the worker being stopped has exited."""
        ending = self._thread
        if ending is not None and ending.is_alive():
            hold_measurement_while(current, ending.join)

    def wait(self) -> None:
        """Until the worker being stopped has exited (bounded: `WorkerClient.stop` kills one
        that does not)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class OptimizerStepWarmup:
    """A worker of its own that compiles torchao's AdamW steps for `variants` ((weights,
    optimizer_state) pairs, in turn) into the Inductor cache the trials share, at the lowest CPU
    priority, while the search's trials run (`engine/optimizer_steps.py`).

    Its start, like the next trial's worker's, is kept out of every measurement: a trial run
    while it starts holds its measured steps until it is up (`hold_until_started`). Its compile
    then runs beside the trials' measurements, on CPU cores they leave idle.

    A worker that could not start or died is started again, up to `START_ATTEMPTS` in all,
    `RESTART_AFTER_S` apart, for the pairs not yet compiled: a trial beside it can fill the GPU
    for a while (an fp32 baseline that runs out of memory), and a CUDA context cannot be made
    then. What happened to it is kept in `notes`, for the report."""

    START_ATTEMPTS = 3
    RESTART_AFTER_S = 15.0
    HOLD_AT_MOST_S = 30.0
    """The longest a trial's measured steps wait for this worker's start (a worker was ready
    after 6-11 s in the GPU searches of 2026-12-06, `startup.ready_s`): a start that hangs must
    not stall every trial, as a trial's own would."""

    def __init__(self, spec: WorkerSpec, variants: tuple[tuple[str, str], ...],
                 start_timeout: float | None = None) -> None:
        self.spec = spec
        self.variants = variants
        self.compiled: dict[tuple[str, str], float | None] = {}
        """(weights, state) -> seconds its compile took; None where it failed."""
        self.notes: list[str] = []
        """What went wrong with the worker, in order: a start that failed, a death."""
        self.started = threading.Event()
        """Set while no start of this worker is under way (it is up, or could not start)."""
        self._timeout = start_timeout_s() if start_timeout is None else start_timeout
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._since = time.monotonic()
        self._busy_since: float | None = None
        """When the worker began the pair it compiles now (None: it compiles none)."""
        self._client = WorkerClient(spec)
        self._thread: threading.Thread | None = None
        if self._spawn("could not be started"):  # else each trial compiles its own
            self._thread = threading.Thread(target=self._run, name="gputune-optimizer-steps",
                                            daemon=True)
            self._thread.start()

    def _note(self, what: str) -> None:
        with self._lock:
            self.notes.append(f"{time.monotonic() - self._since:.0f} s: the worker {what}")

    def _run(self) -> None:
        for attempt in range(1, self.START_ATTEMPTS + 1):
            if attempt > 1:
                if self._closed.wait(self.RESTART_AFTER_S) or not self._spawn(
                        "could not be started again"):
                    break
            try:
                finished = self._compile_in(self._client)
            except Exception as exc:  # (a closed pipe): a note, never a traceback on the console
                self._note(f"was given up: {type(exc).__name__}: {exc}")
                finished = True
            finally:
                self.started.set()
                self._client.stop()
            if finished or self._closed.is_set():
                break

    def _spawn(self, failed: str) -> bool:
        """A fresh worker process for the pairs left; False (noted as `failed`, with why) where
        none could be spawned or the search has ended."""
        with self._lock:  # (spawned under the lock: `close` ends it, never one half made)
            if self._closed.is_set():
                return False
            self.started.clear()
            self._client = WorkerClient(self.spec)
            try:
                self._client.start()
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            except BaseException:  # interrupted as it spawned: ended here, not left to the exit
                self._client.end_now()
                raise
            else:
                return True
        self._note(f"{failed}: {why}")
        self.started.set()
        return False

    def _compile_in(self, client: WorkerClient) -> bool:
        """The pairs not yet compiled, compiled in `client`; True once none is left, the search
        ended or a start failed for good; False where it is worth starting again (the worker
        ran out of GPU memory as it started, or died)."""
        event = wait_ready(client, self._timeout)
        self.started.set()
        if not isinstance(event, protocol.WorkerReady):
            why = event.message if isinstance(event, protocol.RunFailed) else (
                "was not ready in time" if client.is_alive() else "died while starting")
            self._note(f"did not start: {why}")
            # Only a start the GPU's memory or a death stopped is tried again: an invalid
            # workload stays invalid.
            return isinstance(event, protocol.RunFailed) and "out of memory" not in why.lower()
        left = tuple(v for v in self.variants if v not in self.compiled)
        client.send(protocol.CompileOptimizerSteps(left))
        self._busy_since = time.monotonic()
        while len(self.compiled) < len(self.variants) and not self._closed.is_set():
            event = client.wait_event(1.0)
            if isinstance(event, protocol.OptimizerStepsCompiled):
                with self._lock:
                    self.compiled[(event.weights, event.state)] = (
                        None if event.error else event.seconds)
                    self._busy_since = time.monotonic()
                if event.error:
                    self._note(f"could not compile {pair_label((event.weights, event.state))}: "
                               f"{event.error.splitlines()[0][:200]}")
            elif event is None and not client.is_alive():
                break
        self._busy_since = None
        left = [v for v in self.variants if v not in self.compiled]
        if not left or self._closed.is_set():
            return True
        # It died on the first pair left (they compile in order): that one is not tried again.
        code = client.process.exitcode if client.process is not None else None
        with self._lock:
            self.compiled[left[0]] = None
        self._note(f"died (exit code {code}) while compiling {pair_label(left[0])}")
        return len(left) == 1

    def done(self) -> dict[tuple[str, str], float | None]:
        """The variants compiled so far (seconds; None where it failed)."""
        with self._lock:
            return dict(self.compiled)

    def what_happened(self) -> tuple[str, ...]:
        """The notes, and the pair the worker is compiling now, since when (a compile starved
        of CPU, or hung, reads differently from a worker that failed)."""
        with self._lock:
            notes = list(self.notes)
            left = [v for v in self.variants if v not in self.compiled]
            busy = self._busy_since
        if left and busy is not None:
            now = time.monotonic()
            notes.append(f"{now - self._since:.0f} s: the worker is compiling "
                         f"{pair_label(left[0])}, for {now - busy:.0f} s so far")
        return tuple(notes)

    def hold_until_started(self, current: WorkerClient) -> None:
        """`current`'s measured steps wait until this worker is up (or could not start), for
        `HOLD_AT_MOST_S` at most."""
        if not self.started.is_set():
            hold_measurement_while(current, lambda: self.started.wait(self.HOLD_AT_MOST_S))

    def close(self) -> None:
        """Stop the worker, where it still compiles or waits to start again."""
        with self._lock:
            self._closed.set()
            client = self._client
        client.end_now()
        if self._thread is not None:
            self._thread.join(timeout=3.0)
        self.started.set()


def run_one(
    client: WorkerClient,
    config: TuneConfig,
    plan: TrialPlan,
    reference: tuple[float, ...],
    progress: Progress,
    stop_if_slower_than_ms: float | None = None,
    reference_dir: str | None = None,
    inapplicable: Mapping[str, str] | None = None,
) -> protocol.TrialResult:
    """`inapplicable`: what changes nothing in the model (`strategies.applicability`), left out
    of the label of a row made here (the worker labels the rows it returns itself)."""
    label = config.label(skip=inapplicable or ())
    client.send(protocol.RunTrial(config, plan.steps, plan.warmup_steps, reference,
                                  stop_if_slower_than_ms=stop_if_slower_than_ms,
                                  profile_steps=plan.profile_steps, trace_path=plan.trace_path,
                                  reference_dir=reference_dir))
    started = time.monotonic()
    deadline = started + plan.trial_timeout_s
    limit = started + max(plan.trial_timeout_s, plan.limit_s or 0.0)
    pace = StepPace(plan.warmup_steps + plan.steps + plan.profile_steps, plan.trial_timeout_s)
    progress.set("building")
    measured = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            later = pace.extended(now, limit)
            if later is None:
                break
            deadline = later
            progress.set("slower than planned", "still stepping")
        event = client.wait_event(0.25)
        progress.tick()
        if event is None:
            if not client.is_alive():
                return protocol.TrialResult(config=config.to_dict(), label=label,
                                            status="crash", message=died(client.exitcode()))
            continue
        if isinstance(event, protocol.CompileStarted):
            progress.set("compiling")
        elif isinstance(event, protocol.StepPart):
            pace.part(time.monotonic())
        elif isinstance(event, protocol.StepMeasured):
            pace.step(time.monotonic())
            if event.step >= plan.warmup_steps:
                measured += 1
                progress.set("measuring", f"{measured}/{plan.steps}")
                if measured >= plan.steps and plan.profile_steps:
                    progress.set("profiling")
            else:
                progress.set("warming up")
        elif isinstance(event, protocol.TrialFinished):
            return event.result
        elif isinstance(event, protocol.RunFailed):
            if event.result is not None:
                return event.result
            return protocol.TrialResult(
                config=config.to_dict(), label=label, status=event.kind,
                message=event.message,
            )
    now = time.monotonic()
    why = (f" ({pace.describe(now)}; its limit was {limit - started:.0f} s)"
           if pace.is_stepping(now) else "")
    return protocol.TrialResult(
        config=config.to_dict(), label=label, status="crash",
        message=f"{NO_RESULT} {deadline - started:.0f} s; the worker was stopped{why}",
    )


def runnable(configs: list[TuneConfig], caps: Capabilities,
             default_batch: int) -> tuple[list[TuneConfig], list[str]]:
    """The configurations this machine can run and whose batch the devices and the micro-batch
    divide; a line for each of the others."""
    keep, skipped = [], []
    for config in configs:
        try:
            config.check_runnable(caps)
            config.accumulation_steps(config.batch_size or default_batch)
            keep.append(config)
        except ConfigError as exc:
            skipped.append(f"{config.label()}: {exc}")
    return keep, skipped


def best(results: list[protocol.TrialResult]) -> protocol.TrialResult | None:
    """The fastest configuration that ran and kept the reference's loss."""
    good = [r for r in results if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False]
    return max(good, key=lambda r: r.tokens_per_s) if good else None

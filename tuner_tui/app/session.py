"""What the dashboard knows about this session, as plain data updated by pure event handling.

`Session.apply(event)` folds one worker event into the state; the widgets only read it. Keeping
this apart from Textual makes the bookkeeping (markers, leaderboard rows, baseline, crashes)
testable without an app, and lets a recorded event list rebuild the same screen.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import protocol
from tuner_tui.engine.noise import adaptive_cap
from tuner_tui.engine.protocol import measured_peak

SERIES_CAPACITY = 4096
"""Steps kept for the plots; older ones scroll out."""

LOG_CAPACITY = 1000


class LogLine(NamedTuple):
    """A line of the log view (key l)."""

    level: str
    """info, warning or error."""
    text: str
    source: str = "worker"
    """Who said it: the worker, the dashboard, or a library (torch, torchao, transformers...)."""


class Series:
    """Values indexed by a session-wide step counter; keeps the last `capacity` of them, each
    marked steady or not (the first step and the warm-up: plotted, left out of the scale)."""

    def __init__(self, capacity: int = SERIES_CAPACITY) -> None:
        self.values: deque[float] = deque(maxlen=capacity)
        self.steady: deque[bool] = deque(maxlen=capacity)
        self.dropped = 0
        """How many values scrolled out; value i is step `dropped + i`."""

    def append(self, value: float, steady: bool = True) -> None:
        if len(self.values) == self.values.maxlen:
            self.dropped += 1
        self.values.append(value)
        self.steady.append(steady)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def end(self) -> int:
        """Step counter of the next value."""
        return self.dropped + len(self.values)


@dataclass(frozen=True)
class Marker:
    """A configuration change, drawn on the plots at step `position` (session-wide counter)."""

    position: int
    number: int
    """The run's number in this session, the same as its leaderboard row's."""
    label: str


@dataclass
class Row:
    """One leaderboard row: a configuration tried in this session."""

    number: int
    """Session-wide run number (run ids restart with each worker process)."""
    key: tuple[int, int] | None
    """(worker generation, run id) of the run that produced it."""
    result: protocol.TrialResult

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"


def failed_result(config: dict, label: str, status: str, message: str) -> protocol.TrialResult:
    return protocol.TrialResult(config=dict(config), label=label, status=status, message=message)


def config_label(config: dict) -> str:
    try:
        return TuneConfig.from_dict(config).label()
    except ConfigError:
        return "invalid configuration"


@dataclass
class Session:
    """Everything the panels show, built from worker events (and a few app-level facts)."""

    capabilities: Capabilities | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    """Monotonic seconds: the app's clock, fixed in tests."""
    measure_steps: int = 20
    """Steps a run measures before its row, more while noisy (noise.adaptive_cap)."""
    environment: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    worker_pid: int | None = None
    worker_state: str = "starting"
    """starting, ready, applying, running, compiling, paused, idle (after a failure), dead,
    stopped."""
    worker_note: str = ""
    """A line about the worker's state (why it died, what it is restarting)."""
    setup_error: str = ""
    """Why the worker could not set up (a workload that fails to build, no such device): kept
    in the status line until a worker is ready, not only in a toast that vanishes."""

    run_id: int | None = None
    run_label: str = ""
    run_config: dict = field(default_factory=dict)
    batch_size: int = 0
    compile_started_at: float | None = None
    """Monotonic time at which the current compile began; None when not compiling."""
    compile_what: str = ""
    """What the current run's first step builds (CompileStarted.what)."""
    applying_since: float | None = None
    """When the configuration being prepared was sent (its reference, gradients and build)."""
    preparing_note: str = ""
    """What the worker said it builds meanwhile (the fused kernels' C++ nodes)."""
    run_started_at: float | None = None
    warmup_steps: int = 5
    """The current run's steps before its measured ones."""
    run_times: list = field(default_factory=list)
    """Step times (ms) of the current run's measured steps so far."""
    run_rates: list = field(default_factory=list)
    """Their rates (tokens/s): the panel's figure until the run's row is in."""
    compile_s: float | None = None
    """Compile time of the current run, once known."""
    paused_state: str = "running"
    generation: int = 0
    """How many workers were started; part of every run's key."""
    run_number: int = 0
    """Runs started this session; the number of the current run."""
    run_numbers: dict = field(default_factory=dict)
    """(worker generation, run id) -> run number."""
    search_note: str = ""
    """Progress of the automatic search, shown in the status line; empty when none runs."""
    pending: tuple[dict, str] | None = None
    """(config, label) sent to the worker and not started yet."""
    profile_note: str = ""
    """What the profile panel says while a profile is on its way."""
    profiled: list[int] = field(default_factory=list)
    """Numbers of the rows that received a profile, in order."""

    last_step: protocol.StepMeasured | None = None
    throughput: Series = field(default_factory=Series)
    step_ms: Series = field(default_factory=Series)
    loss: Series = field(default_factory=Series)
    markers: list[Marker] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    logs: deque = field(default_factory=lambda: deque(maxlen=LOG_CAPACITY))
    """LogLine entries, oldest first: the log view (key l)."""
    logs_added: int = 0
    """Lines ever added to `logs` (it keeps the last LOG_CAPACITY)."""
    log_path: str = ""
    """The worker's log file, named in the log view."""
    version: int = 0
    """Incremented on every change; widgets redraw when it moved."""
    rows_version: int = 0
    """Incremented when a leaderboard row is added or changed."""

    # -- queries ---------------------------------------------------------------------------------
    @property
    def baseline(self) -> Row | None:
        """The first row that ran: the change column is measured against it."""
        return next((r for r in self.rows if r.ok and r.result.tokens_per_s), None)

    def change_vs_baseline(self, row: Row) -> float | None:
        return self.change(row.result.tokens_per_s)

    def row_for_run(self, run_id: int | None) -> Row | None:
        if run_id is None:
            return None
        key = (self.generation, run_id)
        return next((r for r in self.rows if r.key == key), None)

    def _add_row(self, run_id: int | None, result: protocol.TrialResult) -> Row:
        key = (self.generation, run_id) if run_id is not None else None
        number = self.run_numbers.get(key) if key is not None else None
        if number is None:  # a run refused before it started still counts as one
            self.run_number += 1
            number = self.run_number
        row = Row(number, key, result)
        self.rows.append(row)
        self.rows_version += 1
        return row

    @property
    def item_name(self) -> str:
        """What the workload counts per sample: tokens for the language models."""
        return str(self.workload.get("item_name") or "tokens")

    def current_result(self) -> protocol.TrialResult | None:
        row = self.row_for_run(self.run_id)
        return row.result if row else None

    def current_row(self) -> Row | None:
        return self.row_for_run(self.run_id)

    def current_rate(self) -> tuple[float | None, bool]:
        """The current run's rate and whether it is its measured row's (True) or the median of
        its measured steps so far (False): the figure the leaderboard shows, or will."""
        result = self.current_result()
        if result is not None and result.tokens_per_s:
            return result.tokens_per_s, True
        if self.run_rates:
            return statistics.median(self.run_rates), False
        return None, False

    def change(self, rate: float | None) -> float | None:
        """`rate` against the baseline row's, as the leaderboard's "vs base" column divides."""
        base = self.baseline
        if base is None or not rate:
            return None
        return rate / base.result.tokens_per_s

    def current_peak(self) -> tuple[int | None, bool]:
        """The current run's peak memory and whether it is its measured row's (the larger of
        the allocated and reserved peaks, as the leaderboard and bench count it) or the
        steps' so far. After the row, later steps (a profile's own buffers) do not move it."""
        result = self.current_result()
        if result is not None and measured_peak(result):
            return measured_peak(result), True
        step = self.last_step
        return (step.peak_memory_bytes if step else None), False

    def measuring(self) -> tuple[int, int] | None:
        """(measured steps so far, the most the run may take) while its row is not in yet."""
        if self.run_id is None or self.current_result() is not None or not self.run_times:
            return None
        return len(self.run_times), adaptive_cap(self.measure_steps)

    def first_step_for(self, now: float) -> float | None:
        """Seconds the current run has waited for its first step (builds, the first compile),
        None once a step came or when no run is on."""
        if self.run_id is None or self.last_step is not None or self.run_started_at is None:
            return None
        if self.worker_state not in ("running", "compiling"):
            return None
        return max(0.0, now - self.run_started_at)

    def preparing_for(self, now: float) -> float | None:
        """Seconds since the configuration being prepared (reference, build) was sent."""
        if self.worker_state != "applying" or self.applying_since is None:
            return None
        return max(0.0, now - self.applying_since)

    def log(self, level: str, text: str, source: str = "dashboard") -> None:
        self._log(LogLine(level, text, source))
        self.version += 1

    def _log(self, line: LogLine) -> None:
        self.logs.append(line)
        self.logs_added += 1

    def warnings_logged(self) -> int:
        return sum(1 for line in self.logs if line.level in ("warning", "error"))

    def last_profiled(self) -> Row | None:
        number = self.profiled[-1] if self.profiled else None
        return next((r for r in self.rows if r.number == number), None)

    def compiling_for(self, now: float) -> float | None:
        """Seconds the current compile has run, or None when not compiling."""
        if self.worker_state != "compiling" or self.compile_started_at is None:
            return None
        return max(0.0, now - self.compile_started_at)

    # -- updates ---------------------------------------------------------------------------------
    def apply(self, event: Any, now: float) -> None:
        """Fold one worker event in; `now` is time.monotonic() when the UI received it."""
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is not None:
            handler(event, now)
            self.version += 1

    def _on_WorkerReady(self, event: protocol.WorkerReady, now: float) -> None:
        caps = dict(event.capabilities)
        self.capabilities = Capabilities(**caps)
        self.environment = dict(event.environment)
        self.workload = dict(event.workload)
        self.worker_pid = event.pid
        self.worker_state = "ready"
        self.worker_note = ""
        self.setup_error = ""

    def _on_RunStarted(self, event: protocol.RunStarted, now: float) -> None:
        self.pending = None
        self.run_id = event.run_id
        self.run_label = event.label
        self.run_config = event.config.to_dict()
        self.batch_size = event.batch_size
        self.compile_started_at = None
        self.compile_s = None
        self.compile_what = ""
        self.last_step = None  # the panel shows this run's figures, not the last run's
        self.run_started_at = now
        self.applying_since = None
        self.warmup_steps = event.warmup_steps
        self.run_times = []
        self.run_rates = []
        self.worker_state = "running"
        self.run_number += 1
        self.run_numbers[(self.generation, event.run_id)] = self.run_number
        self.markers.append(Marker(self.throughput.end, self.run_number, event.label))

    def _on_CompileStarted(self, event: protocol.CompileStarted, now: float) -> None:
        if event.run_id == self.run_id:
            self.worker_state = "compiling"
            self.compile_started_at = now
            self.compile_what = event.what

    def _on_CompileFinished(self, event: protocol.CompileFinished, now: float) -> None:
        if event.run_id == self.run_id:
            self.worker_state = "running"
            self.compile_started_at = None
            self.compile_s = event.seconds

    def _on_StepMeasured(self, event: protocol.StepMeasured, now: float) -> None:
        if event.run_id != self.run_id:
            return  # a straggler from a run that was replaced
        compiling_step = self.worker_state == "compiling"
        if compiling_step:
            self.worker_state = "running"
            self.compile_started_at = None
        self.last_step = event
        # The first step (it holds torch.compile's work) and the warm-up are plotted but mark
        # no scale: the plots scale to the steady rate.
        steady = not compiling_step and event.step >= self.warmup_steps
        if steady and self.row_for_run(event.run_id) is None:
            self.run_times.append(event.step_ms)
            self.run_rates.append(event.tokens_per_s)
        self.throughput.append(event.tokens_per_s, steady)
        self.step_ms.append(event.step_ms, steady)
        self.loss.append(event.loss if math.isfinite(event.loss) else math.nan, steady)

    def _on_TrialFinished(self, event: protocol.TrialFinished, now: float) -> None:
        row = self.row_for_run(event.run_id)
        if row is not None:
            row.result = event.result
            self.rows_version += 1
        else:
            self._add_row(event.run_id, event.result)
        if event.run_id == self.run_id and event.result.compile_s is not None:
            self.compile_s = self.compile_s if self.compile_s is not None else event.result.compile_s

    def _on_RunFailed(self, event: protocol.RunFailed, now: float) -> None:
        row = self.row_for_run(event.run_id)
        if event.result is not None:
            result = event.result
        elif row is not None:
            result = replace(row.result, status=event.kind, message=event.message)
        elif event.run_id == self.run_id:
            result = failed_result(self.run_config, self.run_label, event.kind, event.message)
        elif self.pending is not None:
            # Refused before it started (RunStarted never came): the row is the request.
            result = failed_result(self.pending[0], self.pending[1], event.kind, event.message)
        else:
            result = None  # the worker failed to set up: nothing was tried
            self.setup_error = event.message or event.kind
        if row is not None:
            row.result = result
            self.rows_version += 1
        elif result is not None:
            self._add_row(event.run_id, result)
        self.pending = None
        # The current run, or a request that failed before it started (the worker numbers a
        # request before building it): either way the worker now waits for a command.
        if self.run_id is None or event.run_id >= self.run_id:
            self.worker_state = "idle"
            self.compile_started_at = None
        self._log(LogLine("error", f"{event.kind}: {event.message}"))

    def _on_ProfileMeasured(self, event: protocol.ProfileMeasured, now: float) -> None:
        row = self.row_for_run(event.run_id)
        if row is None:
            return  # the run's worker died meanwhile
        row.result = replace(row.result, profile=dict(event.profile))
        self.rows_version += 1
        self.profiled.append(row.number)
        self.profile_note = ""
        if event.profile.get("error"):
            self._log(LogLine("warning", event.profile["error"]))

    def _on_Paused(self, event: protocol.Paused, now: float) -> None:
        if self.worker_state != "paused":
            self.paused_state = self.worker_state
        self.worker_state = "paused"

    def _on_Resumed(self, event: protocol.Resumed, now: float) -> None:
        self.worker_state = self.paused_state if self.paused_state != "paused" else "running"

    def _on_WorkerLog(self, event: protocol.WorkerLog, now: float) -> None:
        if event.level == "info" and not event.source and self.worker_state == "applying":
            self.preparing_note = event.text
        self._log(LogLine(event.level, event.text, event.source or "worker"))

    # -- app-level facts (not protocol events) ---------------------------------------------------
    def applying(self, config: dict, label: str) -> None:
        """A configuration was sent; the worker builds it (and its loss reference) before the
        RunStarted that follows."""
        self.worker_state = "applying"
        self.worker_note = label
        self.pending = (dict(config), label)
        self.applying_since = self.clock()
        self.preparing_note = ""
        self.version += 1

    def worker_started(self, pid: int | None) -> None:
        self.generation += 1
        self.run_id = None
        self.worker_pid = pid
        self.worker_state = "starting"
        self.version += 1

    def worker_died(self, exitcode: int | None, crashed: bool = True) -> str:
        """Record a dead worker; unless it was stopped on purpose (`crashed=False`), the run in
        flight without a result becomes a crash row. Returns the line to show the user."""
        how = _exit_description(exitcode)
        message = f"worker process {self.worker_pid or ''} died ({how})".replace("  ", " ")
        if not crashed:
            message = "worker stopped for a restart"
        if crashed and self.run_id is not None and self.row_for_run(self.run_id) is None:
            self._add_row(self.run_id, failed_result(self.run_config, self.run_label, "crash", message))
        self.worker_state = "dead"
        self.worker_note = f"{self.setup_error} ({message})" if self.setup_error else message
        self.compile_started_at = None
        self.run_id = None
        self._log(LogLine("error", message))
        self.version += 1
        return message


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"

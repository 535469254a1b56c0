"""Where the search's trials run: each in a fresh worker process (`runner.py`), the next one's
worker started, and the last one's stopped, while the current trial builds. A worker that dies
under a trial (killed, segfaulted) is given one more try in a fresh process before the trial is
a `crash` row: a kill from outside (the OOM killer, a user's kill -9) need not happen again.
On the CPU, killed by SIGKILL both times, it is an `oom` row: the model's memory is the host's,
and the kernel's out-of-memory killer is what kills so (the memory model then keeps
configurations as large from being tried; on a GPU the host's memory is not the device's).

The search talks to an executor only through `start`, `run` and `close`, so the search's logic
runs as well against a simulated machine (tests/engine/search_oracle.py). Torch-free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from strategies.config import TuneConfig
from tuner_tui.engine import protocol
from tuner_tui.engine.native_build import NativeBuild
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.protocol import TrialResult, WorkerSpec
from tuner_tui.engine.runner import (EndingWorker, NextWorker, OptimizerStepWarmup, TrialPlan,
                                     WorkerStartError, died, run_one, start_worker)

DIED = "the worker process died"
"""The start of the message `run_one` gives a trial whose worker died under it."""


class TrialExecutor(Protocol):
    def start(self) -> protocol.WorkerReady:
        """Start the first worker; what it found (capabilities, environment, workload)."""

    def run(self, config: TuneConfig, plan: TrialPlan, reference: tuple[float, ...],
            progress: Progress, stop_if_slower_than_ms: float | None,
            reference_dir: str | None) -> TrialResult:
        """One trial, always answered with a row (never an exception for the trial's faults)."""

    def warm_optimizer_steps(self, variants: tuple[tuple[str, str], ...]) -> None:
        """Compile torchao's AdamW steps for these (weights, optimizer_state) pairs, in turn,
        beside the trials (`runner.OptimizerStepWarmup`)."""

    def optimizer_steps_compiled(self) -> dict[tuple[str, str], float | None]:
        """Those compiled so far: the seconds each took (None: it failed)."""

    def optimizer_steps_notes(self) -> tuple[str, ...]:
        """What happened to the worker that compiles them: a failed start, a death, the pair
        it is compiling now."""

    def build_native(self) -> None:
        """Build the fused kernels' C++ nodes beside the trials (`native_build.NativeBuild`)."""

    def native_build_summary(self) -> str | None:
        """How that build went (None where none was started); asked as the search ends, so one
        still under way is said to be stopped, as `close` then stops it."""

    def close(self) -> None:
        """Stop every worker still up, and the build beside them."""


class WorkerExecutor:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._next = NextWorker(spec)
        self._ending = EndingWorker()
        self._warmup: OptimizerStepWarmup | None = None
        self._native: NativeBuild | None = None
        self._inapplicable: dict[str, str] = {}
        """What changes nothing in the model, as the first worker said: left out of the labels
        of rows made here (a reference run that failed before its trainer existed)."""

    def build_native(self) -> None:
        if self._native is None:
            self._native = NativeBuild(dict(self.spec.environ))

    def native_build_summary(self) -> str | None:
        return self._native.summary() if self._native is not None else None

    def warm_optimizer_steps(self, variants: tuple[tuple[str, str], ...]) -> None:
        if self._warmup is None and variants:
            self._warmup = OptimizerStepWarmup(self.spec, variants)

    def optimizer_steps_compiled(self) -> dict[tuple[str, str], float | None]:
        return self._warmup.done() if self._warmup is not None else {}

    def optimizer_steps_notes(self) -> tuple[str, ...]:
        return self._warmup.what_happened() if self._warmup is not None else ()

    def start(self) -> protocol.WorkerReady:
        client, ready = start_worker(self.spec)
        self._inapplicable = dict((ready.workload or {}).get("inapplicable") or {})
        self._next.keep(client, ready)  # the first trial runs in the worker that described the machine
        return ready

    def run(self, config: TuneConfig, plan: TrialPlan, reference: tuple[float, ...],
            progress: Progress, stop_if_slower_than_ms: float | None,
            reference_dir: str | None) -> TrialResult:
        result = self._once(config, plan, reference, progress, stop_if_slower_than_ms,
                            reference_dir)
        if result.status == "crash" and result.message.startswith(DIED):
            progress.set("the worker died: trying once more in a fresh one")
            again = self._once(config, plan, reference, progress, stop_if_slower_than_ms,
                               reference_dir)
            if again.status != "crash":
                return again
            killed = died(-9)
            if self.spec.device == "cpu" and result.message.startswith(killed) \
                    and again.message.startswith(killed):
                return replace(again, status="oom", message=f"{again.message} (twice: in a "
                               "fresh worker too); counted as out of the host's memory")
            result = replace(again, message=f"{again.message} (twice: in a fresh worker too)")
        return result

    def _once(self, config, plan, reference, progress, stop_ms, reference_dir) -> TrialResult:
        try:
            client, _ = self._next.take()
        except WorkerStartError as exc:
            return TrialResult(config=config.to_dict(),
                               label=config.label(skip=self._inapplicable), status="crash",
                               message=f"the worker did not start: {exc}")
        # The next trial's worker starts now; this trial's measured steps wait until it is up,
        # the last trial's worker has exited, and the optimizer steps' worker is up, where it
        # is still starting.
        self._next.begin(client)
        self._ending.hold(client)
        if self._warmup is not None:
            self._warmup.hold_until_started(client)
        try:
            return run_one(client, config, plan, reference, progress,
                           stop_if_slower_than_ms=stop_ms, reference_dir=reference_dir,
                           inapplicable=self._inapplicable)
        finally:
            self._ending.end(client)

    def close(self) -> None:
        self._next.close()
        self._ending.wait()
        if self._warmup is not None:
            self._warmup.close()
        if self._native is not None:
            self._native.close()


def error_row(config: TuneConfig, exc: BaseException) -> TrialResult:
    """The row of a configuration the search could not run (an error of the search itself)."""
    return TrialResult(config=config.to_dict(), label=config.label(), status="error",
                       message=f"the search could not run it: {type(exc).__name__}: {exc}")

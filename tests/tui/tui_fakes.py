"""In-process stand-ins for the worker and the telemetry sampler: deterministic, instant.

`FakeWorker` answers commands the way the real worker does (WorkerReady on start; RunStarted,
optional compile events, steps and TrialFinished on ApplyConfig; Paused/Resumed), with figures
computed from the configuration, so app tests run in milliseconds and snapshots are stable.
"""

from __future__ import annotations

import collections
import gzip
import json
import threading
import time
from pathlib import Path

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.app.app import GputuneApp
from tuner_tui.engine import protocol
from tuner_tui.engine.profile import Activity, summarize
from tuner_tui.engine.telemetry import GpuSample, HostSample, ProcessSample, TelemetrySample

CPU_CAPS = Capabilities(
    device="cpu",
    cuda=False,
    bf16=True,
    triton=False,
    reasons={"cuda": "no CUDA device (NVML: library not found)", "triton": "triton needs a CUDA GPU"},
)
GPU_CAPS = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="NVIDIA H200")

WORKLOAD = {
    "name": "gpt2-tiny",
    "items_per_sample": 128,
    "item_name": "tokens",
    "default_batch_size": 8,
}


RECORDED_PROFILE = Path(__file__).parents[1] / "engine" / "data" / "profile-many-tiny-ops-cpu.json.gz"


def host_bound_profile(config: dict) -> dict:
    """The profile the fakes answer `ProfileRun` with: a real CPU profile of a host-bound
    workload (tests/engine/data), summarized by the real analysis for `config`."""
    doc = json.loads(gzip.decompress(RECORDED_PROFILE.read_bytes()))
    activities = [Activity.from_row(row) for row in doc["activities"]]
    return summarize(activities, "cpu", config=config)


def speed_of(config: dict) -> float:
    """Tokens/s the fake reports for a configuration: a fixed, plausible function of it."""
    c = TuneConfig.from_dict(config)
    speed = 10_000.0
    speed *= {"fp32": 1.0, "tf32": 1.5, "bf16": 2.1, "fp16": 2.2}[c.precision]
    speed *= 1.35 if c.compile_mode != "off" else 1.0
    speed *= 1.2 if c.attention == "sdpa" else 1.0
    speed *= 0.75 if c.checkpointing != "off" else 1.0
    speed *= 1.05 if c.optimizer != "plain" else 1.0
    return speed


class FakeWorker:
    """An event source with the real worker's manners. `fail` maps a precision to a failure kind
    (e.g. {"fp16": "diverged"}, or "numerics": it runs but fails the gradient gate) to script faults; `kill()` makes it die like a SIGKILLed process."""

    def __init__(self, caps: Capabilities = CPU_CAPS, steps: int = 24, pid: int = 4242, fail: dict | None = None,
                 spread: float = 0.01, workload: dict | None = None):
        self.caps = caps
        self.workload = dict(workload or WORKLOAD)
        """What its WorkerReady says of the model (`Workload.describe()`)."""
        self.steps = steps
        self.spread = spread
        """Half the interquartile range of the step times its results report, relative."""
        self._pid = pid
        self.fail = fail or {}
        self.events: collections.deque = collections.deque()
        self.commands: list = []
        self.alive = False
        self.code: int | None = None
        self.run_id = 0
        self.config: dict = {}
        self._cond = threading.Condition()

    @property
    def pid(self) -> int | None:
        return self._pid

    def _emit(self, *events) -> None:
        with self._cond:
            self.events.extend(events)
            self._cond.notify_all()

    def start(self) -> None:
        self.alive = True
        self._emit(
            protocol.WorkerReady(
                pid=self._pid,
                capabilities=self.caps.to_dict(),
                environment={"torch": "2.13.0", "device": self.caps.device, "gpu": self.caps.gpu_name},
                workload=dict(self.workload),
            )
        )

    def send(self, command) -> None:
        if not self.alive:
            raise RuntimeError("worker is dead")
        self.commands.append(command)
        if isinstance(command, protocol.ApplyConfig):
            self._apply(command.config)
        elif isinstance(command, protocol.ProfileRun):
            # The real worker waits for the measurement window; the fake's is already over.
            self._emit(protocol.ProfileMeasured(self.run_id, host_bound_profile(self.config)))
        elif isinstance(command, protocol.Pause):
            self._emit(protocol.Paused())
        elif isinstance(command, protocol.Resume):
            self._emit(protocol.Resumed())
        elif isinstance(command, protocol.Shutdown):
            self.alive, self.code = False, 0

    def _apply(self, c: TuneConfig) -> None:
        config = c.to_dict()
        self.config = config
        self.run_id += 1
        run = self.run_id
        events = [protocol.RunStarted(run, c, c.label(), 8)]
        compile_s = None
        if c.compile_mode != "off":
            compile_s = 12.5
            events += [protocol.CompileStarted(run), protocol.CompileFinished(run, compile_s)]
        kind = self.fail.get(c.precision)
        if kind and kind != "numerics":  # numerics: it runs, but its gradients are off
            events.append(protocol.RunFailed(run, kind, f"{kind} injected by the fake worker"))
            self._emit(*events)
            return
        speed = speed_of(config)
        step_ms = 8 * 128 / speed * 1e3
        for step in range(self.steps):
            wobble = 1.0 + 0.04 * ((step * 7) % 5 - 2) / 2
            events.append(
                protocol.StepMeasured(
                    run_id=run, step=step, step_ms=step_ms * wobble, tokens_per_s=speed / wobble,
                    loss=10.8 - 0.05 * step - 0.01 * run, mfu=0.012 * speed / 10_000,
                    memory_allocated_bytes=50 << 20, peak_memory_bytes=(80 << 20) - (10 << 20) * (c.checkpointing != "off"),
                    wall_time=1_700_000_000.0 + run * 100 + step,
                )
            )
        result = protocol.TrialResult(
            config=c.to_dict(), label=c.label(), status=kind or "ok", workload="gpt2-tiny", device=self.caps.device,
            batch_size=8, sequence_length=128, tokens_per_s=speed, samples_per_s=speed / 128, step_ms=step_ms,
            step_ms_q1=step_ms * (1 - self.spread), step_ms_q3=step_ms * (1 + 1.2 * self.spread),
            mfu=0.012 * speed / 10_000, mfu_peak_tflops=2.0, mfu_peak_source="cpu probe",
            peak_memory_bytes=(80 << 20), compile_s=compile_s or 0.05, measured_steps=20,
            loss_ok=True, loss_max_rel_error=0.001, loss_tolerance=0.01, grad_ok=kind != "numerics",
            message="first-step gradients differ from the fp32 reference: ln_f.weight" if kind else "",
        )
        events.append(protocol.TrialFinished(run, result))
        self._emit(*events)

    def wait_event(self, timeout: float):
        with self._cond:
            if not self.events:
                self._cond.wait(timeout)
            if self.events:
                return self.events.popleft()
        return None

    def is_alive(self) -> bool:
        return self.alive

    def exitcode(self):
        return self.code

    def kill(self) -> None:
        with self._cond:
            self.alive, self.code = False, -9
            self._cond.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        self.alive = False
        if self.code is None:
            self.code = 0


class FakeSampler:
    """Telemetry from a fixed H200-like sample (or none, with the real no-NVML reason)."""

    def __init__(self, gpu: bool = True, count: int = 1):
        self.gpu = gpu
        self.count = count
        self.closed = False

    def sample(self, pid=None) -> TelemetrySample:
        gpus = ()
        if self.gpu:
            gpus = tuple(
                GpuSample(i, "NVIDIA H200", 87.0 - 3 * i, (61 + i) << 30, 141 << 30, 512.0 - 10 * i, 700.0,
                          61.0 + i, 1980, 1980, 78.0, 44.0 - i)
                for i in range(self.count)
            )
        return TelemetrySample(
            wall_time=1_700_000_000.0,
            gpus=gpus,
            gpu_unavailable=None if gpus else "NVML not available: library not found (no NVIDIA driver)",
            host=HostSample(23.0, 16, 12 << 30, 128 << 30),
            process=ProcessSample(pid, 101.0, 2 << 30, 24, 2) if pid else None,
            process_note="" if pid else "no worker process",
        )

    def close(self) -> None:
        self.closed = True


async def wait_for(pilot, condition, timeout: float = 10.0, step: float = 0.05) -> None:
    """Let the app run until `condition()` holds; fail with a clear message if it does not."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await pilot.pause(step)


async def wait_until_still(pilot, timeout: float = 10.0, step: float = 0.2) -> None:
    """Let the app run until its whole screen, repainted from scratch, is drawn the same twice
    `step` apart: a snapshot taken then shows no half-done repaint (under a loaded CI host the
    leaderboard's blank last line was twice taken before its repaint)."""
    app = pilot.app
    app.screen.refresh(layout=True)
    await pilot.wait_for_scheduled_animations()
    deadline = time.monotonic() + timeout
    last = None
    while True:
        await pilot.pause(step)
        frame = app.export_screenshot()
        if frame == last:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the screen still changed after {timeout}s")
        last = frame


def async_test(fn):
    """Run an `async def` test with asyncio.run (no pytest-asyncio in the test dependencies)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


class RecordedWorker(FakeWorker):
    """Replays a recorded event list at start, whatever it is sent: the injected-reader fake
    for snapshots of a real run's data."""

    def __init__(self, events: list, **kwargs):
        super().__init__(**kwargs)
        self.recorded = list(events)
        self._pid = self.recorded[0].pid

    def start(self) -> None:
        self.alive = True
        self._emit(*self.recorded)

    def send(self, command) -> None:
        if not self.alive:
            raise RuntimeError("worker is dead")
        self.commands.append(command)


def make_app(start_config=None, **fake):
    workers: list[FakeWorker] = []

    def factory():
        worker = FakeWorker(**fake)
        workers.append(worker)
        return worker

    app = GputuneApp(factory, start_config, sampler_factory=lambda: FakeSampler(gpu=False))
    return app, workers


def number(cell) -> int:
    """A leaderboard row's number, without its mark (★ best, = tie)."""
    return int(str(cell).rstrip("★="))


def applied(worker: FakeWorker) -> list[dict]:
    """The configurations the app sent, as plain dicts."""
    return [c.config.to_dict() for c in worker.commands if isinstance(c, protocol.ApplyConfig)]

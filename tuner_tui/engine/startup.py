"""How long each part of a worker's start takes, before its first trial can run: the budget's
clock is already running (on an H100, 6-12 s: torch's import, the user's workload, torch._dynamo's
import for the model's facts). Reported in `protocol.WorkerReady.startup_s`; a trial's parts the
same way, in `protocol.TrialResult.phases_s`."""

from __future__ import annotations

import os
import time


class Laps:
    """Seconds per part of a span of work, in order, each closed by `done`."""

    def __init__(self, **before: float | None) -> None:
        self.parts: dict[str, float | None] = dict(before)
        self._lap = time.perf_counter()

    def done(self, part: str) -> None:
        now = time.perf_counter()
        self.parts[part] = round(now - self._lap, 3)
        self._lap = now


class StartupTimes(Laps):
    """Seconds per part of the start: "python" (this process's age when made), then each part
    closed by `done`."""

    def __init__(self) -> None:
        super().__init__(python=process_age_s())


def process_age_s() -> float | None:
    """Seconds since this process was created (the interpreter's start and the imports so far),
    from Linux's process table against the uptime, both in ticks of 10 ms (psutil's creation
    time rests on the boot time in whole seconds: it was up to a second off); None where there
    is no /proc."""
    try:
        with open("/proc/self/stat") as stat:
            started = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return round(max(0.0, now - started / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return None

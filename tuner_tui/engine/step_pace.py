"""Whether a trial past its timeout is hung or only slower than planned, from the signs of life
its worker sends: each step's end, and each micro-batch's forward and backward in the warm-up.

A trial's timeout is set from what it was expected to take (`search/deadline.py`), before
anything of the model was measured from a placeholder. A model far slower than that is not
hung: Gemma 3's shape (a 262k vocabulary) at 1024 tokens on two CPU cores gave no first step
within its 81 s, trial after trial, and a search with no time budget measured nothing. Such a
trial runs on, up to its limit (the user's --trial-timeout, the time budget's end), while its
signs of life keep coming: before its steps show a pace, each within the trial's own timeout of
the last; after, at that pace, where the steps left fit. Torch-free.
"""

from __future__ import annotations

import statistics

QUIET_STEPS = 3.0
"""A trial whose last step came more than this many of its typical steps ago (plus QUIET_S) has
stopped stepping: hung, whatever came before."""
QUIET_S = 30.0
ROOM = 1.5
"""The steps left are given this many times what they are expected to take (plus QUIET_S): a
step's pace varies (a measured step waits for the next worker's start)."""
STILL_STEPPING = "it was still stepping"
"""In the message of a trial stopped while its signs of life still came."""


class StepPace:
    """When the signs of life of one trial came (seconds on any one clock). `quiet_s`: how long
    it may be silent before its steps show a pace (its timeout)."""

    def __init__(self, total_steps: int, quiet_s: float) -> None:
        self.total_steps = total_steps
        self.quiet_s = quiet_s
        self.arrivals: list[float] = []
        """When each step ended."""
        self.parts = 0
        self.last_sign: float | None = None

    def part(self, now: float) -> None:
        """A micro-batch's forward or backward was done."""
        self.parts += 1
        self.last_sign = now

    def step(self, now: float) -> None:
        self.arrivals.append(now)
        self.last_sign = now

    def seconds_a_step(self) -> float | None:
        """The typical time between two steps (None before two: the first holds the build and
        any compile)."""
        if len(self.arrivals) < 2:
            return None
        return statistics.median(b - a for a, b in zip(self.arrivals, self.arrivals[1:]))

    def steps_left(self) -> int:
        return max(0, self.total_steps - len(self.arrivals))

    def is_stepping(self, now: float) -> bool:
        """Whether its signs of life still come: with a pace, the last step within QUIET_STEPS
        of its typical steps (and QUIET_S); before, the last sign within `quiet_s`."""
        pace = self.seconds_a_step()
        if pace is not None:
            return now - self.arrivals[-1] <= QUIET_STEPS * pace + QUIET_S
        return self.last_sign is not None and now - self.last_sign < self.quiet_s

    def extended(self, now: float, limit: float) -> float | None:
        """A later time to stop the trial, no later than `limit`, where it still steps (and,
        with a pace, its steps left fit before `limit`); None where it is to be stopped now."""
        if not self.is_stepping(now):
            return None
        pace = self.seconds_a_step()
        if pace is None:
            later = min(limit, self.last_sign + self.quiet_s)
        else:
            needed = self.steps_left() * pace
            if now + needed > limit:
                return None
            later = min(limit, now + ROOM * needed + QUIET_S)
        return later if later > now else None

    def describe(self, now: float) -> str:
        """How far a trial stopped while it stepped got, for its message."""
        pace = self.seconds_a_step()
        if pace is None:
            return (f"{STILL_STEPPING}: {len(self.arrivals)} of {self.total_steps} steps ended, "
                    f"{self.parts} micro-batch parts done, the last {now - self.last_sign:.0f} s "
                    f"before")
        return (f"{STILL_STEPPING}: {len(self.arrivals)} of {self.total_steps} steps, "
                f"{pace:.1f} s a step, {self.steps_left() * pace:.0f} s more needed")

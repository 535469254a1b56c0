"""The progress line of `bench` and `tune`: one status line per trial, rewritten in place on a
terminal with a bar (rich) and the time left, printed once per state change otherwise (logs, CI).

On a terminal the line is drawn by hand (carriage return, then erase to the end of the line)
rather than with rich's live display: the commands print their own lines between trials, and
off a terminal rich shows a live display only when it stops, while a log wants one line per state
change as it happens.
"""

from __future__ import annotations

import io
import re
import shutil
import time
from typing import TextIO

from tuner_tui import format as fmt

BAR_WIDTH = 20


def _count(total: int | str) -> int | None:
    """The number in a total such as 9 or "~12" (the search's estimate), or None."""
    if isinstance(total, int):
        return total
    found = re.search(r"\d+", str(total))
    return int(found.group()) if found else None


def _steps(detail: str) -> float | None:
    """How far a trial is from a detail such as "12/20" (measured steps), or None."""
    found = re.fullmatch(r"\s*(\d+)/(\d+)\s*", detail or "")
    if not found or not int(found.group(2)):
        return None
    return min(1.0, int(found.group(1)) / int(found.group(2)))


class Progress:
    """One status line per trial: rewritten in place on a terminal, printed per state change
    otherwise (logs, CI)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self.state = ""
        self.detail = ""
        self.prefix = ""
        self.index = 0
        self.total: int | None = None
        self.eta_s: float | None = None
        self.durations: list[float] = []
        """Seconds each finished trial took: the time left is estimated from them."""
        self._drawn = False

    def begin(self, index: int, total: int | str, label: str, note: str = "",
              eta_s: float | None = None) -> None:
        """`note` adds context after the count, e.g. the search's elapsed time and best so far.
        `eta_s`: the caller's own estimate of the time left for all the work, if it has one
        (otherwise it is estimated from the trials done so far)."""
        self.prefix = f"[{index}/{total}{' | ' + note if note else ''}] {label}"
        self.index, self.total, self.eta_s = index, _count(total), eta_s
        self.started = time.monotonic()
        self.set("starting worker")

    def set(self, state: str, detail: str = "") -> None:
        """`state` is the phase (printed once per change off a terminal); `detail` is a counter
        shown only on a terminal."""
        if state != self.state and not self.tty:
            print(f"{self.prefix}: {state}", file=self.out, flush=True)
        self.state = state
        self.detail = detail
        self.tick()

    # -- the time left -------------------------------------------------------------------------
    def fraction(self) -> float | None:
        """How much of all the work is done (trials done, and how far the current one is)."""
        if not self.total:
            return None
        elapsed = time.monotonic() - self.started
        within = _steps(self.detail) if self.state == "measuring" else None
        if within is None and self.durations:
            within = min(0.95, elapsed / (sum(self.durations) / len(self.durations)))
        return min(1.0, (self.index - 1 + (within or 0.0)) / self.total)

    def time_left(self) -> float | None:
        """Seconds left for all the work: the caller's estimate, else the trials to come at the
        mean time of those done (unknown before the first one ends)."""
        if self.eta_s is not None:
            return max(0.0, self.eta_s - (time.monotonic() - self.started))
        if not self.total or not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        elapsed = time.monotonic() - self.started
        current = max(0.0, mean - elapsed)
        measured = _steps(self.detail) if self.state == "measuring" else None
        if measured:  # this trial's own pace, once its measured steps are under way
            current = max(current, elapsed * (1 - measured) / measured)
        return current + mean * max(0, self.total - self.index)

    # -- drawing -------------------------------------------------------------------------------
    def _bar(self, fraction: float) -> str:
        from rich.console import Console
        from rich.progress_bar import ProgressBar

        console = Console(file=io.StringIO(), force_terminal=True, color_system="standard",
                          width=BAR_WIDTH)
        console.print(ProgressBar(total=1.0, completed=fraction, width=BAR_WIDTH), end="")
        return console.file.getvalue()

    def line(self, width: int) -> str:
        """The line drawn on a terminal of `width` columns: the trial and its state, cut to
        fit, then the bar, the share done and the time left."""
        elapsed = time.monotonic() - self.started
        tail = f" {elapsed:5.1f} s"
        fraction = self.fraction()
        left = self.time_left()
        if left is not None:
            tail += f"  ETA {fmt.clock(left)}"
        head = f"{self.prefix}: {self.state} {self.detail}".rstrip()
        bar = ""
        if fraction is not None and width >= len(head[:24]) + BAR_WIDTH + len(tail) + 6:
            bar = f" {self._bar(fraction)} {fraction:4.0%}"
            room = width - BAR_WIDTH - 6 - len(tail) - 1
        else:
            room = width - len(tail) - 1
        if len(head) > room:
            head = head[: max(0, room - 1)] + "…"
        return head + bar + tail

    def tick(self) -> None:
        if not self.tty:
            return
        width = shutil.get_terminal_size((100, 24)).columns
        self.out.write("\r" + self.line(width) + "\x1b[K")
        self.out.flush()
        self._drawn = True

    def end(self, summary: str) -> None:
        if self.state not in ("", "starting worker"):  # a row reused from the store took no time
            self.durations.append(time.monotonic() - self.started)
        if self.tty and self._drawn:
            self.out.write("\r\x1b[K")
            self._drawn = False
        print(f"{self.prefix}: {summary}", file=self.out, flush=True)
        self.state = ""

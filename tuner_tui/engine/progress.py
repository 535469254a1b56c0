"""The progress line of `bench` and `tune`: one status line per trial, rewritten in place on a
terminal, printed once per state change otherwise (logs, CI).

Plain text rather than rich's live display: off a terminal rich shows a live display only when
it stops, and a log wants one line per state change as it happens.
"""

from __future__ import annotations

import time
from typing import TextIO


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
        self._last_line = ""

    def begin(self, index: int, total: int | str, label: str, note: str = "") -> None:
        """`note` adds context after the count, e.g. the search's elapsed time and best so far."""
        self.prefix = f"[{index}/{total}{' | ' + note if note else ''}] {label}"
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

    def tick(self) -> None:
        if not self.tty:
            return
        line = f"{self.prefix}: {self.state} {self.detail} {time.monotonic() - self.started:6.1f} s"
        self.out.write("\r" + line.ljust(len(self._last_line)))
        self.out.flush()
        self._last_line = line

    def end(self, summary: str) -> None:
        if self.tty:
            self.out.write("\r" + " " * len(self._last_line) + "\r")
        print(f"{self.prefix}: {summary}", file=self.out, flush=True)
        self.state = ""

"""The terminal of `gputune bench` and `tune`, which may go away while they run: a closed
window (writes fail with EIO), a pipe whose reader left (`gputune tune | head`: EPIPE). Torch-free.

What a run measured is written to its files whatever happens to its terminal: printing is
the one thing a lost terminal may cost.
"""

from __future__ import annotations

import contextlib
import os
import sys


class TerminalStream:
    """sys.stdout or sys.stderr for the length of a command, whose writes never raise. When the
    terminal is gone (EIO once it closed, EPIPE from a pipe whose reader left, ENOSPC on a full
    disk), what is printed from then on is dropped, so the run goes on to write its files; and
    the file descriptor is pointed at /dev/null, so that other handles on it (the stream this
    one wraps, flushed again at exit) stop failing too."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self.stream.write(text)
            except UnicodeEncodeError:  # a terminal that cannot show a character: show "?"
                encoding = getattr(self.stream, "encoding", None) or "ascii"
                return self.write(text.encode(encoding, "replace").decode(encoding))
            except (OSError, ValueError):  # ValueError: the stream was closed
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._lose()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def _lose(self) -> None:
        self.lost = True
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError, AttributeError):  # (io.UnsupportedOperation is both)
            return
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


@contextlib.contextmanager
def terminal_streams():
    """sys.stdout and sys.stderr wrapped in TerminalStream while a command runs."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None and not isinstance(sys.stdout, TerminalStream):
        sys.stdout = TerminalStream(sys.stdout)
    if sys.stderr is not None and not isinstance(sys.stderr, TerminalStream):
        sys.stderr = TerminalStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved

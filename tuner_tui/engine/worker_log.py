"""Where a worker's output goes: into its run's log file, never onto the user's terminal.

torch, torchao, triton and transformers print warnings at import and while they work (torchao's
"Failed to load ..._C_mxfp8...so", torch's "W1202 ... is an Enum subclass"), and a worker
inherits the terminal of the process that started it: in the dashboard those lines were drawn
over the screen, in `bench` and `tune` over the progress line, once per trial. So the worker
sends its standard output and error (the file descriptors, so that C++ and subprocesses follow)
to the run's log file, `runs/<time>-<command>-<pid>/worker.log` under the gputune home, and
passes each distinct warning to its parent as a `WorkerLog` event (the dashboard's log view).
Every warning is also counted in `warnings.tsv` beside the log, from which `bench` and `tune`
print one summary at the end (`summary_lines`). Torch-free.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from tuner_tui.engine.paths import gputune_home

RUNS_KEPT = 30
"""Run folders kept under `runs/`; older ones are removed when a new one is made."""
LIBRARIES = ("torch", "torchao", "triton", "transformers", "py.warnings", "tuner_tui", "strategies",
             "kernels", "gputune_kernels")
"""Loggers whose warnings reach the log view (others still go to the log file)."""
WARNINGS_FILE = "warnings.tsv"


def runs_folder() -> Path:
    return gputune_home() / "runs"


def new_run_log(command: str) -> Path:
    """A fresh run folder for `command` (dashboard, bench, tune) and the path of its worker log;
    the oldest run folders beyond RUNS_KEPT are removed."""
    root = runs_folder()
    folder = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    old = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name)[:-RUNS_KEPT]
    for stale in old:
        shutil.rmtree(stale, ignore_errors=True)
    return folder / "worker.log"


def _source(name: str) -> str:
    """The library a logger belongs to, as the log view names it."""
    if name == "py.warnings":
        return "warnings"
    return name.split(".")[0] or "worker"


_TORCH_PREFIX = re.compile(r"^\[?(rank\d+\]:)?[DIWEC]\d{4} [\d:.]+ \d+ \S+\] ")


def one_line(text: str) -> str:
    """The first line of a log message, without torch's "W1202 06:12:14.1 123 file.py:630] "."""
    first = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return _TORCH_PREFIX.sub("", first.strip())


class ForwardWarnings(logging.Handler):
    """Sends the first occurrence of each distinct warning to `emit(level, text, source)` and
    counts every occurrence in the run's warnings file."""

    def __init__(self, emit: Callable[[str, str, str], None], counts_path: Path | None) -> None:
        super().__init__(level=logging.WARNING)
        self._emit = emit
        self._counts_path = counts_path
        self._seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = one_line(record.getMessage())
        except Exception:  # noqa: BLE001 - a bad format string must not break the worker
            return
        if not text:
            return
        source = _source(record.name)
        level = "error" if record.levelno >= logging.ERROR else "warning"
        if self._counts_path is not None:
            try:
                with open(self._counts_path, "a", encoding="utf-8") as f:
                    f.write(f"{source}\t{text}\n")
            except OSError:
                pass
        if text not in self._seen:
            self._seen.add(text)
            self._emit(level, text, source)


_handler: ForwardWarnings | None = None


def capture_output(log_path: str | os.PathLike | None, emit: Callable[[str, str, str], None]) -> None:
    """In the worker, before anything imports torch: standard output and error to `log_path`
    (appended: a run's workers share it), Python warnings into logging, and warnings of the
    libraries passed to `emit(level, text, source)`. Without a path the output stays where it
    is (a worker started by a test or a script) and warnings are still passed on."""
    global _handler
    counts = None
    if log_path is not None:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        counts = path.with_name(WARNINGS_FILE)
        print(f"--- worker {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}",
              file=sys.stderr, flush=True)
    logging.captureWarnings(True)
    root = logging.getLogger()
    if not any(isinstance(h, logging.StreamHandler) and h.stream is sys.stderr for h in root.handlers):
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)
    _handler = ForwardWarnings(emit, counts)
    attach_library_loggers()


def attach_library_loggers() -> None:
    """Attach the forwarding handler to the root logger and to every library logger that does
    not pass its records up (torch's own loggers keep theirs to themselves); called again once
    torch is imported, as it makes its loggers then. A record stops at the first such logger on
    its way up, so it meets the handler once."""
    if _handler is None:
        return
    loggers = [logging.getLogger()]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (isinstance(logger, logging.Logger) and not logger.propagate
                and name.split(".")[0] in {n.split(".")[0] for n in LIBRARIES}):
            loggers.append(logger)
    for logger in loggers:
        if _handler not in logger.handlers:
            logger.addHandler(_handler)


def summary_lines(log_path: str | os.PathLike | None, top: int = 3) -> list[str]:
    """What `bench` and `tune` print once at the end about their workers' output: how many
    warnings, the most frequent, how many crash reports, and where the full log is. Empty when
    there was nothing to say."""
    if log_path is None:
        return []
    path = Path(log_path)
    try:
        lines = path.with_name(WARNINGS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    try:
        crashes = path.read_text(encoding="utf-8", errors="replace").count(
            "Traceback (most recent call last)")
    except OSError:
        crashes = 0
    counts = Counter(line.partition("\t")[2] or line for line in lines if line.strip())
    out = []
    if counts:
        total, kinds = sum(counts.values()), len(counts)
        out.append(f"worker warnings: {total} ({kinds} distinct), in {path}")
        for text, n in counts.most_common(top):
            out.append(f"  {n}x {text if len(text) <= 110 else text[:109] + '…'}")
        if kinds > top:
            out.append(f"  ... and {kinds - top} more in the log")
    if crashes:
        out.append(f"worker crash reports: {crashes}, in {path}")
    return out

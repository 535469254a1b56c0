"""What `bench` and `tune` write and print at the end of a run: each output written whatever
happens to the others (one line per output that could not be), the exports with the files they
kept, `tune`'s dated report, the line that says what ran where, and the workers' warnings.
Imports no torch."""

from __future__ import annotations

import datetime
import functools
import sys
from pathlib import Path
from typing import Callable

from strategies import exports
from strategies.config import ConfigError
from strategies.files import WriteError, write_atomic

def print_written(written: list, label: str) -> None:
    """What an export wrote, and the earlier files it kept."""
    for item in written:
        if item.fmt in exports.TRAINER_FORMATS:
            print(f"wrote {item.path} ({exports.TRAINER_NAMES[item.fmt]})")
        else:
            print(f"exported {label} to {item.path}")
        for line in item.lines():
            print(line)


def dated_report_path(out: str, now: datetime.datetime | None = None) -> Path:
    """`tune`'s report beside its export, named by the date and time it was written, so that
    runs can be compared: gputune.toml -> gputune-report-2026-12-02-074512.txt."""
    out_path = Path(out)
    stamp = (now or datetime.datetime.now()).strftime("%Y-%m-%d-%H%M%S")
    path = out_path.with_name(f"{out_path.stem}-report-{stamp}.txt")
    n = 1
    while path.exists():  # two runs in one second
        n += 1
        path = out_path.with_name(f"{out_path.stem}-report-{stamp}-{n}.txt")
    return path


def print_worker_warnings(spec) -> None:
    """The workers' warnings, once, summarised, with the log's path."""
    from tuner_tui.engine.worker_log import summary_lines

    for line in summary_lines(spec.log_path):
        print(line)


def describe_run(workload: dict, environment: dict) -> str:
    """The line above a report: what ran where, leaving out what is not known."""
    parts = [f"{workload['name']} on {environment.get('gpu_name') or 'CPU'}"]
    item, per = workload.get("item_name", "tokens"), workload.get("items_per_sample")
    if per and per != 1:  # "1 samples per sample" says nothing
        parts.append(f"{per} {item} per sample")
    parts.append(f"default batch {workload['default_batch_size']}")
    for key in ("torch", "triton", "cuda", "driver"):
        if environment.get(key):
            parts.append(f"{key} {environment[key]}")
    return ", ".join(parts)


def write_outputs(outputs: list[tuple[str, object, Callable[[], object]]]) -> list[str]:
    """Write each output, whatever happens to the others: (what, said when written, write)
    triples such as ("--json r.json", "wrote r.json", lambda: ...); what is said may be a
    function of what the write returned. Returns one "what: why" line per output not written."""
    problems = []
    for what, done, write in outputs:
        try:
            value = write()
        except (WriteError, ConfigError, OSError) as exc:
            problems.append(f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        if callable(done):
            done(value)
        else:
            print(done)
    return problems


def say_not_written(problems: list[str]) -> None:
    if problems:
        print("gputune: not written: " + "; ".join(problems), file=sys.stderr)


def write_tune_outputs(args, outcome, report: str, trainers: tuple[str, ...] = ()) -> list[str]:
    """--json, the report beside the export (dated, so runs compare) and the exported
    recommendation (--out, with the trainers' files of --format), each written whatever
    happens to the others; one line per output not written."""
    from tuner_tui.engine import search

    outputs = []
    if args.json:
        outputs.append((f"--json {args.json}", f"wrote {args.json}",
                        lambda: search.write_json(args.json, outcome)))
    report_path = dated_report_path(args.out)
    outputs.append((f"the report {report_path}", f"wrote {report_path}",
                    lambda: write_atomic(report_path, report + "\n")))
    if outcome.recommendation is not None:
        write = functools.partial(exports.write_with_trainers, trainers=trainers)
        outputs.append((f"--out {args.out}",
                        lambda written: print_written(written, outcome.recommendation.label),
                        lambda: search.export(outcome, args.out, write=write)))
    return write_outputs(outputs)

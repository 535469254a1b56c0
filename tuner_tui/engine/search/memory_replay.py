"""Replay a committed `tune --json` or `bench --json` file through the memory model: feed its
trials in the order they ran, as the search and bench do (each estimate sees only the trials
measured before it), and set each trial's estimate beside its measured peak. Torch-free.

    python -m tuner_tui.engine.search.memory_replay benchmarks/results/h200-2026-11-30/*/*.json

The order comes from the tune file's time line or, in files written before it, from the log
beside the file (`X.log` beside `X.json`): a tune file lists its trials ranked, not in the
order they ran. Without either, the file's own order is used (bench writes its trials in the
order they ran)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tuner_tui.engine.protocol import TrialResult, measured_peak
from tuner_tui.engine.search.memory import MemoryEstimate, estimate, prior_estimate
from tuner_tui.engine.search.memory_prior import ModelShape

WORKLOAD_SHAPES = {
    # examples/hf_causal_lm.py's Llama on a GPU (Llama 3.2 1B's shape, untied head); the
    # committed H200 files were written before trials carried `model_shape`.
    "hf-llama-1b": ModelShape(layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8,
                              vocab=128256, seq_len=2048),
    # the built-in GPT-2 124M (vocab padded to 50304), whose early files carry no shape
    "gpt2-124m": ModelShape(layers=12, hidden=768, intermediate=3072, heads=12, kv_heads=12,
                            vocab=50304, seq_len=1024, loss_in_fp32=False),
    # the built-in llama-1b: its files up to 2026-12-01 do not say that it repeats k and v, nor
    # that its loss keeps no fp32 logits
    "llama-1b": ModelShape(layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8,
                           vocab=128256, seq_len=2048, kv_repeated=True, loss_in_fp32=False),
}

# A trial's progress line: "[3/10 | 2m10s elapsed] LABEL: ..." (tune) or "[3/6] LABEL: ..." (bench).
# The leaders' re-measurement ("[1/2 | re-measuring the leaders, ...]") runs no new trial.
_TRIAL_LINE = re.compile(r"^\[(\d+)/\d+(?: \| (?!re-measuring)[^\]]*)?\] (.+?): ")


@dataclass(frozen=True)
class ReplayRow:
    result: TrialResult
    estimate: MemoryEstimate | None
    """What the memory model estimates from the trials before this one (None: nothing yet)."""

    @property
    def peak(self) -> int | None:
        return measured_peak(self.result)

    @property
    def error(self) -> float | None:
        """The estimate over the measured peak, minus 1 (+0.10: 10% over)."""
        if self.estimate is None or not self.peak:
            return None
        return self.estimate.total / self.peak - 1


def run_order(results: list[TrialResult], log: str | None) -> list[TrialResult]:
    """`results` in the order they ran, by their progress lines in `log`: the k-th trial of a
    label takes that label's k-th trial number. Trials the log does not name keep their place
    after those it does."""
    if not log:
        return list(results)
    numbers: dict[str, list[int]] = {}
    seen = set()
    for line in log.splitlines():
        match = _TRIAL_LINE.match(line)
        if match and (int(match.group(1)), match.group(2)) not in seen:
            seen.add((int(match.group(1)), match.group(2)))
            numbers.setdefault(match.group(2), []).append(int(match.group(1)))
    keyed = []
    for place, r in enumerate(results):
        found = numbers.get(r.label, [])
        keyed.append(((found.pop(0), place) if found else (10**9, place), r))
    return [r for _, r in sorted(keyed, key=lambda item: item[0])]


def timeline_order(results: list[TrialResult], timeline: list[dict]) -> list[TrialResult]:
    """`results` in the order a tune file's time line says they ran (its trials, not the
    re-measures); those it does not name keep their place after those it does."""
    first: dict[str, int] = {}
    for event in timeline:
        if event.get("kind") != "remeasure":
            first.setdefault(event["label"], len(first))
    return [r for _, r in sorted(enumerate(results),
                                 key=lambda item: (first.get(item[1].label, 10**9), item[0]))]


def replay(ordered: list[TrialResult], default_batch: int,
           shape: ModelShape | None = None) -> list[ReplayRow]:
    """Each trial's estimate from the trials before it, as `SearchDriver.evaluate` makes it
    (the first's from the model's shapes, `prior_estimate`)."""
    rows = []
    for i, r in enumerate(ordered):
        found = estimate(r.tune_config, ordered[:i], default_batch, shape)
        if found is None:  # the first trial: from the shapes alone, as bench and tune make it
            found = prior_estimate(r.tune_config, r, default_batch, shape)
        rows.append(ReplayRow(r, found))
    return rows


def replay_file(path: str | Path) -> list[ReplayRow]:
    path = Path(path)
    data = json.loads(path.read_text())
    log_path = path.with_suffix(".log")
    log = log_path.read_text(errors="replace") if log_path.exists() else None
    results = [TrialResult.from_dict(r) for r in data["results"]]
    workload = data["workload"]
    ordered = (timeline_order(results, data["timeline"]) if data.get("timeline")
               else run_order(results, log))
    return replay(ordered, workload["default_batch_size"],
                  WORKLOAD_SHAPES.get(workload["name"]))


def format_rows(rows: list[ReplayRow]) -> str:
    gib = 2**30
    lines = [f"{'status':9} {'peak GiB':>8} {'est GiB':>8} {'error':>7}  configuration"]
    for row in rows:
        peak = f"{row.peak / gib:.2f}" if row.peak else "-"
        est = "-"
        if row.estimate is not None:
            est = ("" if row.estimate.certain else "~") + f"{row.estimate.total / gib:.2f}"
        error = f"{row.error:+.1%}" if row.error is not None else "-"
        lines.append(f"{row.result.status:9} {peak:>8} {est:>8} {error:>7}  {row.result.label}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    worst = 0.0
    for path in paths:
        if "results" not in json.loads(Path(path).read_text()):
            print(f"== {path}: not a tune or bench file (no results), skipped")
            continue
        rows = replay_file(path)
        print(f"== {path}")
        print(format_rows(rows))
        worst = max([worst] + [abs(r.error) for r in rows if r.error is not None])
    print(f"largest error: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

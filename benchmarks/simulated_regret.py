"""The search's mean regret on simulated machines (tests/engine/search_oracle.py), by model size,
and where it lies: in the options the answer took, or in its batch and micro-batch.

    python benchmarks/simulated_regret.py [--seeds 0:1000] [--minutes 5] [--json FILE]

Each seed is one oracle (a model, a memory budget, the levers' true effects); the search runs on
it under a virtual clock, as in tests/engine/test_search_simulated.py. The regret is 1 - the
answer's true speed / the fastest configuration of the space. It is split in two:
- options: what the best batch and micro-batch for the answer's own options still lack;
- batch: what the answer's batch and micro-batch lose against those (the rest);
and `accumulate` says what running the answer with the largest batch the oracle counts, at its
own micro-batch, would have recovered. Seeds 0-999 take about two and a half minutes on two
cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ((0, 3e8, "under 300M"), (3e8, 1e9, "300M-1B"), (1e9, 2e9, "1B-2B"), (2e9, 1e12, "over 2B"))


def _paths() -> None:
    for path in (ROOT, ROOT / "tests", ROOT / "tests" / "engine"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _own_options_at_their_best_batch(oracle, space, answer):
    """The space with every option but the batch held at the answer's values (its kernels as
    the oracle lists them: under compile only the fused loss counts)."""
    from search_oracle import AXES

    batch_keys = ("batch_size", "micro_batch_size")
    fixed = {key: getattr(answer, key) for key, _ in space.choices if key not in batch_keys}
    fixed = {key: list(v) if isinstance(v, tuple) else v for key, v in fixed.items()}
    fixed.update({key: v for key, v in space.fixed if key not in fixed})
    kernels = tuple(fixed.get("fused_kernels", ()))
    if kernels not in AXES["fused_kernels"]:
        fixed["fused_kernels"] = list(AXES["fused_kernels"][2 if "linear_cross_entropy" in kernels
                                                             else 1])
    choices = tuple((key, values) for key, values in space.choices if key in batch_keys)
    return dataclasses.replace(space, choices=choices, fixed=tuple(fixed.items()))


def search_one(args: tuple[int, float]) -> dict:
    seed, budget_s = args
    _paths()
    from search_oracle import MAX_DOUBLINGS, Oracle
    from simulated_search import regret, simulate

    from strategies.config import TuneConfig

    oracle = Oracle(seed)
    with tempfile.TemporaryDirectory() as folder:
        outcome, _, _ = simulate(oracle, Path(folder), budget_s)
    row = {"seed": seed, "params": oracle.params, "budget": oracle.budget_kind,
           "regret": regret(oracle, outcome), "options": None, "batch": None, "accumulate": None,
           "answer": outcome.recommendation.label if outcome.recommendation else None}
    if outcome.recommendation is None:
        return row
    answer = TuneConfig.from_dict(outcome.recommendation.config)
    best = oracle.optimum(outcome.space)
    own = oracle.optimum(_own_options_at_their_best_batch(oracle, outcome.space, answer))
    got = (1 - row["regret"]) * best
    row["options"] = 1 - own / best if best else 0.0
    row["batch"] = row["regret"] - row["options"]
    micro = answer.micro_batch_size or answer.batch_size or oracle.default_batch
    largest = oracle.default_batch * 2 ** MAX_DOUBLINGS
    if largest >= micro and largest % micro == 0:
        try:
            accumulated = oracle.true_speed(answer.replace(
                batch_size=largest, micro_batch_size=micro if micro < largest else 0))
        except Exception:  # (a combination the rules refuse)
            accumulated = None
        if accumulated:
            row["accumulate"] = max(0.0, 1 - got / accumulated)
    return row


def _mean(rows, key) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{statistics.mean(values):.2%}" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:1000", help="FIRST:END (END excluded)")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="write each seed's row here")
    args = parser.parse_args()
    first, end = (int(x) for x in args.seeds.split(":"))
    with Pool(2) as pool:
        rows = pool.map(search_one, [(seed, args.minutes * 60) for seed in range(first, end)],
                        chunksize=4)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"seeds {first}-{end - 1}, {args.minutes:g} minutes: mean regret {_mean(rows, 'regret')}"
          f" (options {_mean(rows, 'options')}, batch {_mean(rows, 'batch')}; the answer at the "
          f"largest batch, its own micro-batch, would recover {_mean(rows, 'accumulate')})")
    for low, high, name in SIZES:
        group = [r for r in rows if low <= r["params"] < high]
        if group:
            print(f"  {name:10s} {len(group):4d} searches: regret {_mean(group, 'regret')}, "
                  f"options {_mean(group, 'options')}, batch {_mean(group, 'batch')}, adds "
                  f"{sum(r['regret'] for r in group) / len(rows) * 100:.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())

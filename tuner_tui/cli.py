"""The `gputune` command: the dashboard by default, `bench` and `tune` headless.

User errors (bad flags, bad configuration files, a workload that does not import) print one
line that names the problem and the allowed values, and exit with code 2. This module imports
no torch; the worker processes do.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
from pathlib import Path

from strategies.config import (
    ConfigError, ExportedConfig, TuneConfig, format_of, parse_assignments, read, save,
)
from strategies.registry import OPTIONS
from tuner_tui import __version__

DEVICES = ("auto", "cuda", "cpu")
PROFILE_STEPS = 3
"""Steps a profile summarizes (the same as profiler.PROFILE_STEPS, which imports torch)."""
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


def _workload_names() -> str:
    # Listed here rather than imported from the engine, which imports torch.
    return "auto, gpt2-tiny, gpt2-124m, gpt2-350m, llama-tiny, llama-1b, or module:function"


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="auto",
                   help=f"what to train: {_workload_names()} (default: auto = gpt2-124m on a "
                        "GPU, gpt2-tiny on the CPU)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default: cuda if available)")
    p.add_argument("--data", metavar="FILE", help="train on this text file (byte-level tokens) "
                   "instead of synthetic tokens")
    p.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence (default: the "
                   "workload's)")
    p.add_argument("--seed", type=int, default=0, help="seed for the initial weights and the "
                   "batches (default 0)")


def add_profile_options(p: argparse.ArgumentParser, which: str) -> None:
    p.add_argument("--profile", action="store_true",
                   help=f"profile {which} over a few steps after its measured ones: where the "
                        "step's time goes, the bottleneck (host, memory, compute, communication) "
                        "and what to try")
    p.add_argument("--trace", metavar="DIR", help="with the profile, write each profiled "
                   "trial's Chrome/Perfetto trace into DIR (implies --profile)")


def profile_steps(args) -> int:
    """Steps profiled per trial, after checking --trace; 0 without --profile or --trace."""
    if args.trace is not None:
        path = Path(args.trace)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--trace {args.trace} is a file: a folder is wanted")
        existing = next((p for p in [path, *path.parents] if p.exists()), None)
        if existing is not None and not os.access(existing, os.W_OK):
            raise UsageError(f"--trace {args.trace}: {existing} is not writable")
    return PROFILE_STEPS if args.profile or args.trace is not None else 0


def build_parser() -> Parser:
    parser = Parser(prog="gputune", description="Tune a PyTorch training run on a GPU. With no "
                    "command, opens the dashboard.")
    parser.add_argument("--version", action="version", version=f"gputune {__version__}")
    add_run_options(parser)
    parser.add_argument("--config", metavar="FILE", help="start from an exported configuration")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    bench = sub.add_parser("bench", help="measure configurations side by side, headless",
                           description="Measure configurations side by side, each in a fresh "
                           "process, and print a table. With no --config or --preset, measures "
                           "the ladder: the fp32 eager baseline, then one strategy added at a time.")
    add_run_options(bench)
    bench.add_argument("--config", metavar="FILE", action="append", default=[],
                       help="an exported configuration to measure (repeatable)")
    from tuner_tui.engine.bench import PRESETS  # torch-free

    bench.add_argument("--preset", action="append", default=[],
                       help="a named set of configurations: " + ", ".join(PRESETS))
    bench.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
                       help="override an option in every configuration, e.g. batch_size=32 "
                            "(repeatable); options: " + ", ".join(OPTIONS))
    bench.add_argument("--steps", type=int, default=20, help="measured steps per configuration "
                       "(default 20)")
    bench.add_argument("--warmup", type=int, default=5, help="steps before measuring, the first "
                       "of which compiles (default 5)")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    bench.add_argument("--export", metavar="FILE", help="export the fastest configuration whose "
                       "loss matched the reference (TOML or JSON by extension)")
    bench.add_argument("--trial-timeout", type=float, default=900.0, metavar="S",
                       help="give up on a configuration after this many seconds (default 900)")
    add_profile_options(bench, "every row")
    add_tune_parser(sub)
    return parser


def add_tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="search for the fastest configuration, headless",
                          description="Search precision, attention, compile mode, optimizer, fused "
                          "kernels, checkpointing and batch size for the fastest configuration "
                          "whose loss matches the fp32 reference, each trial in a fresh process; "
                          "print the ranking and the throughput/memory Pareto front, and export "
                          "the winner.")
    add_run_options(tune)
    tune.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
                      help="hold an option at one value instead of searching it (repeatable)")
    tune.add_argument("--search", metavar="KEY=V1,V2", action="append", default=[], dest="choices",
                      help="the values to try for an option (repeatable); set values join with "
                           "'+', e.g. fused_kernels=none,layer_norm+gelu; batch sizes may be "
                           "multiples of the default, e.g. batch_size=x1,x2,x4")
    tune.add_argument("--compare", metavar="FILE", action="append", default=[],
                      help="an exported configuration to measure first, side by side, such as "
                           "the one you train with now (repeatable); the report gives the "
                           "recommendation's speed against it")
    tune.add_argument("--max-memory", metavar="SIZE", help="memory budget, e.g. 40GiB: trials "
                      "estimated to need more are skipped (default: the GPU's memory; on the "
                      "CPU, the available RAM)")
    tune.add_argument("--budget-minutes", type=float, default=10.0, metavar="M",
                      help="start no trial after this many minutes (default 10; 0: no limit)")
    tune.add_argument("--steps", type=int, default=20, help="measured steps per trial (default 20)")
    tune.add_argument("--warmup", type=int, default=5, help="steps before measuring, the first of "
                      "which compiles (default 5)")
    tune.add_argument("--out", metavar="FILE", default="gputune.toml", help="where to export the "
                      "recommendation (TOML or JSON by extension; default gputune.toml)")
    tune.add_argument("--store", metavar="FILE", help="the result store (default: "
                      "$GPUTUNE_HOME/results.sqlite3 or ~/.cache/gputune/results.sqlite3)")
    tune.add_argument("--json", metavar="FILE", help="write every trial, the front and the "
                      "recommendation as JSON")
    tune.add_argument("--trial-timeout", type=float, default=900.0, metavar="S",
                      help="give up on a trial after this many seconds (default 900)")
    add_profile_options(tune, "every trial as it is measured (the report shows the leading "
                        "rows'; the search tries first what addresses the best's bottleneck)")


def parse_overrides(items: list[str]) -> dict:
    return parse_assignments(items)


def check_run_options(args) -> None:
    if args.device not in DEVICES:
        raise UsageError(f"unknown device {args.device!r}: allowed devices are cuda, cpu, auto")
    if args.data is not None:
        path = Path(args.data)
        if not path.is_file():
            raise UsageError(f"--data file {args.data} does not exist")
        if not os.access(path, os.R_OK):
            raise UsageError(f"--data file {args.data} is not readable")
    if args.seq_len is not None and args.seq_len < 1:
        raise UsageError(f"--seq-len {args.seq_len} is out of range: an integer >= 1")
    name = args.workload
    builtin = {"auto", "gpt2-tiny", "gpt2-124m", "gpt2-350m", "llama-tiny", "llama-1b"}
    if name in builtin:
        return
    module, sep, func = name.partition(":")
    if not sep or not module or not func:
        raise UsageError(f"unknown workload {name!r}: allowed are {_workload_names()}")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"workload {name!r}: cannot import {module!r}: {exc}") from None
    if found is None:
        raise UsageError(f"workload {name!r}: no module named {module!r} (is it on PYTHONPATH?)")


def check_measure_options(args) -> None:
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} is out of range: an integer >= 1")
    if args.warmup < 1:
        raise UsageError(f"--warmup {args.warmup} is out of range: an integer >= 1 (the first "
                         "step compiles)")


def worker_spec(args):
    from tuner_tui.engine.protocol import WorkerSpec

    return WorkerSpec(workload=args.workload, device=args.device, data=args.data,
                      seed=args.seed, sequence_length=args.seq_len)


def cmd_bench(args) -> int:
    from tuner_tui.engine import bench, runner, table

    check_run_options(args)
    check_measure_options(args)
    overrides = parse_overrides(args.overrides)
    configs = [read(path).config for path in args.config]
    for name in args.preset:
        if name not in bench.PRESETS:
            raise UsageError(f"unknown preset {name!r}: allowed presets are " + ", ".join(bench.PRESETS))
        configs += bench.PRESETS[name]()
    strict = bool(args.config) and not args.preset
    if not configs:
        configs = bench.ladder()
    plan = bench.BenchPlan(worker_spec(args), configs, steps=args.steps, warmup_steps=args.warmup,
                           trial_timeout_s=args.trial_timeout, overrides=overrides,
                           profile_steps=profile_steps(args), trace_dir=args.trace)
    def save_rows(results, environment, workload) -> None:
        bench.write_json(args.json, results, environment, workload, plan)

    try:
        results, environment, workload = bench.run_bench(
            plan, strict=strict, on_result=save_rows if args.json else None
        )
    except runner.WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    gpu = environment.get("gpu_name") or "CPU"
    print(f"\n{workload['name']} on {gpu}, {workload['items_per_sample']} {workload['item_name']} per sample, "
          f"default batch {workload['default_batch_size']}, torch {environment.get('torch')}, "
          f"triton {environment.get('triton')}, driver {environment.get('driver')}")
    # The results first: nothing measured is lost if printing fails.
    if args.json:
        bench.write_json(args.json, results, environment, workload, plan)
    print(table.format_table(results, item_name=workload.get("item_name", "tokens")))
    if plan.profile_steps:
        print(table.format_profiles(results))
    if args.json:
        print(f"wrote {args.json}")
    top = runner.best(results)
    if args.export:
        if top is None:
            print("no configuration ran with a matching loss; nothing exported", file=sys.stderr)
            return 1
        measured = top.measured()
        save(ExportedConfig(TuneConfig.from_dict(top.config), measured, environment,
                            workload["name"]), args.export)
        print(f"exported {top.label} to {args.export}")
    return 0 if any(r.status == "ok" for r in results) else 1


def cmd_tune(args) -> int:
    from tuner_tui.engine import runner, search
    from tuner_tui.engine.store import ResultStore, StoreError

    check_run_options(args)
    check_measure_options(args)
    if args.budget_minutes < 0:
        raise UsageError(f"--budget-minutes {args.budget_minutes:g} is out of range: a number >= 0 "
                         "(0: no limit)")
    max_memory = None
    if args.max_memory is not None:
        try:
            max_memory = search.parse_bytes(args.max_memory)
        except ValueError as exc:
            raise UsageError(f"--max-memory {exc}") from None
    overrides = parse_overrides(args.overrides)
    choices = {}
    for item in args.choices:
        key, sep, text = item.partition("=")
        if not sep:
            raise UsageError(
                f"--search {item!r} must look like KEY=V1,V2, e.g. precision=fp32,bf16"
            )
        if key.strip() in overrides:
            raise UsageError(f"--search {key.strip()} and --set {key.strip()} both name one option")
        choices[key.strip()] = search.parse_choices(key.strip(), text)
    format_of(args.out)
    if not Path(args.out).resolve().parent.is_dir():
        raise UsageError(f"--out {args.out}: its folder does not exist")
    plan = search.SearchPlan(
        worker_spec(args), steps=args.steps, warmup_steps=args.warmup, max_memory_bytes=max_memory,
        budget_s=args.budget_minutes * 60 or None, trial_timeout_s=args.trial_timeout,
        fixed=overrides, choices=choices, compare=[read(path).config for path in args.compare],
        profile_steps=profile_steps(args), trace_dir=args.trace,
    )
    try:
        store = ResultStore(args.store)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    try:
        outcome = search.Search(plan, store).run()
    except runner.WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
    environment, workload = outcome.environment, outcome.workload
    print(f"\n{workload['name']} on {environment.get('gpu_name') or 'CPU'}, "
          f"{workload['items_per_sample']} tokens per sequence, default batch "
          f"{workload['default_batch_size']}, torch {environment.get('torch')}, triton "
          f"{environment.get('triton')}, driver {environment.get('driver')}; store {store.path}")
    print(search.report(outcome))
    if args.json:
        search.write_json(args.json, outcome)
        print(f"wrote {args.json}")
    if search.export(outcome, args.out) is None:
        print("nothing exported", file=sys.stderr)
        return 1
    print(f"exported {outcome.recommendation.label} to {args.out}")
    return 0


def cmd_dashboard(args) -> int:
    check_run_options(args)
    start = read(args.config).config if args.config else None
    from tuner_tui.app import run_dashboard

    return run_dashboard(worker_spec(args), start)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # `--workload mymodule:build` should find modules in the current directory, as
    # `python -m` would; the worker processes inherit this path.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = build_parser()
    # SIGTERM takes the same path as Ctrl-C, so `finally` blocks stop the worker processes.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        args = parser.parse_args(argv)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "tune":
            return cmd_tune(args)
        return cmd_dashboard(args)
    except (UsageError, ConfigError) as exc:
        print(f"gputune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gputune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

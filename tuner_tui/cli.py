"""The `gputune` command: the dashboard by default, `bench` and `tune` headless.

User errors (bad flags, bad configuration files, a workload that does not import) print one
line that names the problem and the allowed values, and exit with code 2. This module imports
no torch; the worker processes do.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from strategies.config import (
    ConfigError, ExportedConfig, format_of, parse_assignments, read, save,
)
from strategies.files import WriteError, check_writable
from strategies.registry import MAX_BATCH_SIZE, OPTIONS
from tuner_tui import __version__
from tuner_tui.engine import kernel_knobs
from tuner_tui.engine.paths import compile_cache_environ, module_exists

DEVICES = ("auto", "cuda", "cpu")
PROFILE_STEPS = 3
"""Steps a profile summarizes (the same as profiler.PROFILE_STEPS, which imports torch)."""
EXIT_USAGE = 2
MAX_SEED = 2**32 - 1
"""Seeds are mixed with the step number into torch generator seeds, which must fit 64 bits."""


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
    parser.add_argument("--max-memory", metavar="SIZE", help="memory budget the memory panel "
                        "shows the peak against, e.g. 24GiB")
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
    add_trust_options(bench, "before --export names the best, the two leaders (when close) are")
    bench.add_argument("--store", metavar="FILE", help="the result store (default: "
                       "$GPUTUNE_HOME/results.sqlite3 or ~/.cache/gputune/results.sqlite3)")
    add_profile_options(bench, "every row")
    add_tune_parser(sub)
    return parser


def add_trust_options(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument("--fresh", action="store_true", help="measure every configuration again "
                   "instead of reusing results stored by this code on this machine (the new "
                   "results are still stored)")
    p.add_argument("--remeasure", type=int, default=2, metavar="N",
                   help=f"{who} re-measured N times each, interleaved, each run in a fresh "
                        "process; a difference within the spread is a tie, won by the simpler "
                        "configuration (default 2; 0: off)")


def add_tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="search for the fastest configuration, headless",
                          description="Search precision, attention, compile mode, optimizer, fused "
                          "kernels, checkpointing and batch size (with --set devices=N, also DDP "
                          "against FSDP2) for the fastest configuration "
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
                           "recommendation's speed against it. A file that sets no batch size "
                           "trains at the run's")
    tune.add_argument("--max-memory", metavar="SIZE", help="memory budget per GPU, e.g. 40GiB: "
                      "with devices > 1 each rank's peak counts against it; trials estimated to "
                      "need more are skipped (default: the GPU's memory; on the CPU, the "
                      "available RAM, shared by the processes)")
    tune.add_argument("--budget-minutes", type=float, default=10.0, metavar="M",
                      help="the search's time, the leaders' re-measurement included: no "
                      "trial starts that would leave too little to re-measure them (default "
                      "10; 0: no limit)")
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
    add_trust_options(tune, "after the search, the leaders (up to 3 within a few spreads of "
                      "the best) are")
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
    if args.seq_len is not None and not 1 <= args.seq_len <= 2**24:
        raise UsageError(f"--seq-len {args.seq_len} is out of range: an integer from 1 to {2**24}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed {args.seed} is out of range: an integer from 0 to {MAX_SEED}")
    name = args.workload
    builtin = {"auto", "gpt2-tiny", "gpt2-124m", "gpt2-350m", "llama-tiny", "llama-1b"}
    if name in builtin:
        return
    module, sep, func = name.partition(":")
    if not sep or not module or not func:
        raise UsageError(f"unknown workload {name!r}: allowed are {_workload_names()}")
    # The current folder is searched for a user's module (as `python -m` would), after the
    # installed packages, so a stray file there cannot shadow one of them.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    # Found without running it: the worker imports it, and reports its errors in one line.
    if not module_exists(module):
        raise UsageError(f"workload {name!r}: no module named {module!r} (is it on PYTHONPATH?)")


def check_measure_options(args) -> None:
    if not 1 <= args.steps <= 10**6:
        raise UsageError(f"--steps {args.steps} is out of range: an integer from 1 to 1000000")
    if not 1 <= args.warmup <= 10**6:
        raise UsageError(f"--warmup {args.warmup} is out of range: an integer from 1 to 1000000 "
                         "(the first step compiles)")
    if not (math.isfinite(args.trial_timeout) and args.trial_timeout > 0):
        raise UsageError(f"--trial-timeout {args.trial_timeout:g} is out of range: a number of "
                         "seconds > 0")
    if args.remeasure < 0:
        raise UsageError(f"--remeasure {args.remeasure} is out of range: an integer >= 0 "
                         "(0: off)")


def check_output(path: str | None, flag: str, config_file: bool = False) -> None:
    """A file the command will write: refused now, not after an hour of measurements."""
    if path is None:
        return
    if config_file:
        try:
            format_of(path)
        except ConfigError as exc:
            raise UsageError(f"{flag} {exc}") from None
    try:
        check_writable(path, flag)
    except WriteError as exc:
        raise UsageError(str(exc)) from None


def check_batch_multiples(choices: list[str]) -> None:
    """`--search batch_size=x2`: a multiple of the workload's default, which only the worker
    knows; the factor itself is checked here."""
    for item in choices:
        key, _, text = item.partition("=")
        if key.strip() != "batch_size":
            continue
        for value in (t.strip() for t in text.split(",")):
            if not value.startswith("x"):
                continue
            try:
                factor = float(value[1:])
            except ValueError:
                factor = math.nan
            if not (math.isfinite(factor) and 0 < factor <= MAX_BATCH_SIZE):
                raise UsageError(f"--search batch_size={value} is out of range: a multiple of "
                                 "the default batch above zero, e.g. x2 or x0.5")


def worker_spec(args):
    from tuner_tui.engine.protocol import WorkerSpec
    from tuner_tui.engine.worker_log import new_run_log

    # The workers' output goes to this run's log, not the terminal (engine/worker_log.py).
    return WorkerSpec(workload=args.workload, device=args.device, data=args.data,
                      seed=args.seed, sequence_length=args.seq_len,
                      environ=tuple(compile_cache_environ().items()),
                      log_path=str(new_run_log(args.command or "dashboard")))


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


def cmd_bench(args) -> int:
    from tuner_tui.engine import bench, runner, table
    from tuner_tui.engine.noise import noise_lines

    check_run_options(args)
    check_measure_options(args)
    check_output(args.json, "--json")
    check_output(args.export, "--export", config_file=True)
    overrides = parse_overrides(args.overrides)
    configs = [read(path).config for path in args.config]
    for name in args.preset:
        if name not in bench.PRESETS:
            raise UsageError(f"unknown preset {name!r}: allowed presets are " + ", ".join(bench.PRESETS))
        configs += bench.PRESETS[name]()
    strict = bool(args.config) and not args.preset
    if not configs:
        configs = bench.ladder()
    bench.apply_overrides(configs, overrides)  # a bad combination stops here, before any worker
    plan = bench.BenchPlan(worker_spec(args), configs, steps=args.steps, warmup_steps=args.warmup,
                           trial_timeout_s=args.trial_timeout, overrides=overrides,
                           remeasure_repeats=args.remeasure, fresh=args.fresh,
                           profile_steps=profile_steps(args), trace_dir=args.trace)
    def save_rows(results, environment, workload) -> None:
        bench.write_json(args.json, results, environment, workload, plan)

    from tuner_tui.engine.store import ResultStore, StoreError

    try:
        store = ResultStore(args.store)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    try:
        results, environment, workload = bench.run_bench(
            plan, strict=strict, on_result=save_rows if args.json else None, store=store
        )
    except runner.WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
    print("\n" + describe_run(workload, environment))
    # The results first: nothing measured is lost if printing fails.
    if args.json:
        bench.write_json(args.json, results, environment, workload, plan)
    print(table.format_table(results, item_name=workload.get("item_name", "tokens")))
    for line in noise_lines(results):
        print(line)
    if plan.profile_steps:
        print(table.format_profiles(results))
    print_worker_warnings(plan.spec)
    if args.json:
        print(f"wrote {args.json}")
    top = runner.best(results)
    if args.export:
        top, verdict = bench.remeasure_best(plan, results)
        if verdict is not None:
            print(verdict.text())
            if args.json:
                bench.write_json(args.json, results, environment, workload, plan, verdict)
        if top is None:
            print("no configuration ran with a matching loss; nothing exported", file=sys.stderr)
            return 1
        measured = top.measured()
        save(ExportedConfig(top.tune_config, measured, environment,
                            workload["name"]), args.export)
        print(f"exported {top.label} to {args.export}")
    return 0 if any(r.status == "ok" for r in results) else 1


def cmd_tune(args) -> int:
    from tuner_tui.engine import runner, search
    from tuner_tui.engine.store import ResultStore, StoreError

    check_run_options(args)
    check_measure_options(args)
    if not args.budget_minutes >= 0:  # NaN too
        raise UsageError(f"--budget-minutes {args.budget_minutes:g} is out of range: a number of "
                         "minutes > 0 (0 or inf: no limit)")
    check_output(args.out, "--out", config_file=True)
    check_output(args.json, "--json")
    check_batch_multiples(args.choices)
    max_memory = None
    if args.max_memory is not None:
        try:
            max_memory = search.parse_bytes(args.max_memory)
        except (ValueError, OverflowError) as exc:
            raise UsageError(f"--max-memory {args.max_memory!r} is not a size: a number with an "
                             "optional unit, e.g. 40GiB" if isinstance(exc, OverflowError)
                             else f"--max-memory {exc}") from None
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
    plan = search.SearchPlan(
        worker_spec(args), steps=args.steps, warmup_steps=args.warmup, max_memory_bytes=max_memory,
        budget_s=args.budget_minutes * 60 if 0 < args.budget_minutes < math.inf else None,
        trial_timeout_s=args.trial_timeout,
        fixed=overrides, choices=choices, compare=[read(path).config for path in args.compare],
        remeasure_repeats=args.remeasure, fresh=args.fresh,
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
    print(f"\n{describe_run(workload, environment)}; store {store.path}")
    print(search.report(outcome))
    print_worker_warnings(plan.spec)
    if args.json:
        search.write_json(args.json, outcome)
        print(f"wrote {args.json}")
    exported = search.export(outcome, args.out)
    if exported is not None:
        print(f"exported {outcome.recommendation.label} to {args.out}")
    if outcome.interrupted:  # reported and written: then the usual exit of an interrupted run
        raise KeyboardInterrupt
    if exported is None:
        print("nothing exported", file=sys.stderr)
        return 1
    return 0


def cuda_problem() -> str | None:
    """Why torch in a worker would see no CUDA GPU, or None if it does. Asked of a short-lived
    child, since this process imports no torch."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot ask torch about CUDA: {exc}"
    if done.returncode == 0:
        return None
    if done.returncode == 3:
        return "torch sees no CUDA GPU"
    lines = done.stderr.strip().splitlines()
    return f"torch does not import: {lines[-1] if lines else done.returncode}"


def cmd_dashboard(args) -> int:
    check_run_options(args)
    start = read(args.config).config if args.config else None
    budget = None
    if args.max_memory is not None:
        from tuner_tui.engine.search.memory import parse_bytes

        try:
            budget = parse_bytes(args.max_memory)
        except ValueError as exc:
            raise UsageError(f"--max-memory {exc}") from None
    if args.device == "cuda":
        problem = cuda_problem()
        if problem:
            raise UsageError(f"--device cuda: {problem}: allowed devices here are cpu, auto")
    from tuner_tui.app import run_dashboard

    return run_dashboard(worker_spec(args), start, budget)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # SIGTERM and SIGHUP (the terminal closed) take the same path as Ctrl-C, so `finally`
    # blocks stop the worker processes and multiprocessing removes its semaphores. A SIGHUP
    # the user ignored (`nohup gputune tune ...`) stays ignored, so the search outlives the
    # terminal, as a SIGINT ignored by the shell (a background job) does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _raise_interrupt)
    try:
        args = parser.parse_args(argv)
        knob_problems = kernel_knobs.problems()  # read by the kernels in the worker: check first
        if knob_problems:
            raise UsageError(knob_problems[0])
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

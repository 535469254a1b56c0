"""The `gputune` command: the dashboard by default, `bench` and `tune` headless.

User errors (bad flags, bad configuration files, a workload that does not import) print one
line that names the problem and the allowed values, and exit with code 2. An output file that
cannot be written at the end of a run costs only that file: the others are written, one line
names what was not, and the exit code is 3. A closed terminal or pipe costs only the printing.
This module imports no torch; the worker processes do.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from strategies import exports
from strategies.config import ConfigError, ExportedConfig, format_of, parse_assignments, read
from strategies.files import (
    ReadError, WriteError, check_writable, open_regular, write_all, write_atomic,
)
from strategies.registry import MAX_BATCH_SIZE, OPTIONS
from tuner_tui import __version__
from tuner_tui.engine import kernel_knobs, workload_kinds
from tuner_tui.engine.paths import compile_cache_environ, module_exists
from tuner_tui.terminal import terminal_streams

DEVICES = ("auto", "cuda", "cpu")
PROFILE_STEPS = 3
"""Steps a profile summarizes (the same as profiler.PROFILE_STEPS, which imports torch)."""
EXIT_USAGE = 2
EXIT_NOT_WRITTEN = 3
"""The run ended, but an output it was asked for (--json, --export, --out) could not be
written; the line before the exit says which and why."""
EXIT_SEARCH_ERROR = 4
"""`tune` stopped early on an error of its own: what it measured was reported, written and
exported all the same; the report names the error."""
MAX_MEMORY_BYTES = 1 << 60
"""--max-memory above 1 EiB is a typo, not a budget."""
MAX_SEED = 2**32 - 1
"""Seeds are mixed with the step number into torch generator seeds, which must fit 64 bits."""


class UsageError(Exception):
    """Bad input from the user; reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}
        """The subcommands' parsers by name (set by `build_parser`)."""

    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")

    def takes(self, flag: str) -> bool:
        """Whether `flag` (or an abbreviation argparse accepts) is one of this parser's."""
        return any(option.startswith(flag) for option in self._option_string_actions)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, except that an epilog of examples keeps its lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _workload_names() -> str:
    # Listed here rather than imported from the engine, which imports torch.
    return ("auto, gpt2-tiny, gpt2-124m, gpt2-350m, llama-tiny, llama-1b, hf:PATH (a Hugging "
            "Face config.json or its folder), torchvision:NAME, timm:NAME, or module:function")


RUN_OPTIONS = {"workload": "auto", "device": "auto", "data": None, "seq_len": None, "seed": 0}
"""The options of what runs where, with their defaults: given before the command or after it."""
BEFORE = "before_"
"""Prefix of the names the top-level parser stores the options given before a command under."""


def add_run_options(p: argparse.ArgumentParser, before_command: bool = False) -> None:
    """The run options. Stored without a default (the defaults are filled in by `parse_args`,
    which checks that an option given before the command and after it says one thing);
    before the command under names prefixed `before_`."""
    prefix = BEFORE if before_command else ""
    p.add_argument("--workload", dest=prefix + "workload", default=argparse.SUPPRESS,
                   help=f"what to train: {_workload_names()} (default: auto = gpt2-124m on a "
                        "GPU, gpt2-tiny on the CPU)")
    p.add_argument("--device", dest=prefix + "device", default=argparse.SUPPRESS,
                   help="cuda, cpu or auto (default: cuda if available)")
    p.add_argument("--data", dest=prefix + "data", default=argparse.SUPPRESS, metavar="FILE",
                   help="train on this text file (byte-level tokens) instead of synthetic tokens")
    p.add_argument("--seq-len", dest=prefix + "seq_len", default=argparse.SUPPRESS, type=int,
                   metavar="N", help="tokens per sequence (default: the workload's)")
    p.add_argument("--seed", dest=prefix + "seed", default=argparse.SUPPRESS, type=int,
                   help="seed for the initial weights and the batches (default 0)")


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


MAIN_EXAMPLES = """examples:
  gputune
      the dashboard, training the built-in model
  gputune --workload hf:models/Qwen2.5-0.5B
      the dashboard on a Hugging Face model, from its folder's config.json (random weights)
  gputune --device cpu bench --preset quick
      two configurations side by side, headless, on the CPU"""
BENCH_EXAMPLES = """examples:
  gputune bench
      the ladder: fp32 eager, then one strategy added at a time
  gputune bench --workload torchvision:resnet50 --preset quick
      two configurations of a torchvision model, in images/s
  gputune bench --config gputune.toml --set batch_size=32 --json bench.json
      an exported configuration at another batch size, the results also as JSON"""
TUNE_EXAMPLES = """examples:
  gputune tune --budget-minutes 20
      search for 20 minutes, export the winner to gputune.toml
  gputune tune --workload hf:models/Llama-3.2-1B --seq-len 2048 --max-memory 40GiB
      search for a Hugging Face model's config.json, within 40 GiB
  gputune tune --compare mine.toml --search precision=bf16,fp16 --out best.toml
      measure your configuration first; try two precisions only; export to best.toml"""


def build_parser() -> Parser:
    parser = Parser(prog="gputune", formatter_class=HelpFormatter, epilog=MAIN_EXAMPLES,
                    description="Tune a PyTorch training run on a GPU. With no command, opens "
                    "the dashboard. Options given before a command apply to it, as in "
                    "`gputune --device cuda bench`.")
    parser.add_argument("--version", action="version", version=f"gputune {__version__}")
    add_run_options(parser, before_command=True)
    parser.add_argument("--config", dest=BEFORE + "config", metavar="FILE",
                        help="start from an exported configuration (before bench: one to "
                             "measure)")
    parser.add_argument("--max-memory", dest=BEFORE + "max_memory", metavar="SIZE",
                        help="memory budget the memory panel shows the peak against, e.g. "
                             "24GiB (before tune: its budget)")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    bench = sub.add_parser("bench", help="measure configurations side by side, headless",
                           formatter_class=HelpFormatter, epilog=BENCH_EXAMPLES,
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
                       "loss matched the reference (TOML or JSON by extension; a file there is "
                       "kept as FILE.1, FILE.2, ...)")
    add_format_option(bench, "--export")
    bench.add_argument("--trial-timeout", type=float, default=900.0, metavar="S",
                       help="give up on a configuration after this many seconds (default 900)")
    add_trust_options(bench, "before --export names the best, the two leaders (when close) are")
    bench.add_argument("--store", metavar="FILE", help="the result store (default: "
                       "$GPUTUNE_HOME/results.sqlite3 or ~/.cache/gputune/results.sqlite3)")
    add_profile_options(bench, "every row")
    parser.commands = {"bench": bench, "tune": add_tune_parser(sub)}
    return parser


def add_format_option(p: argparse.ArgumentParser, beside: str) -> None:
    p.add_argument("--format", metavar="TRAINER", action="append", default=[], dest="formats",
                   help=f"also write the file a trainer reads, beside {beside}'s: hf "
                        "(transformers TrainingArguments fields), accelerate (its config file), "
                        "lightning (Trainer arguments); repeatable or comma-separated, e.g. "
                        "--format hf,accelerate")


def check_formats(args, path: str | None, flag: str) -> tuple[str, ...]:
    """The trainer formats asked for, their files checked as writable."""
    try:
        trainers = exports.parse_trainer_formats(args.formats)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if trainers and path is None:
        raise UsageError(f"--format needs {flag} FILE: the trainer's file is written beside it")
    for fmt in trainers:
        check_output(str(exports.trainer_path(path, fmt)), "--format")
    return trainers


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


def add_trust_options(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument("--fresh", action="store_true", help="measure every configuration again "
                   "instead of reusing results stored by this code on this machine (the new "
                   "results are still stored)")
    p.add_argument("--remeasure", type=int, default=2, metavar="N",
                   help=f"{who} re-measured N times each, interleaved, each run in a fresh "
                        "process; a difference within the spread is a tie, won by the simpler "
                        "configuration (default 2; 0: off)")


def add_tune_parser(sub) -> Parser:
    tune = sub.add_parser("tune", help="search for the fastest configuration, headless",
                          formatter_class=HelpFormatter, epilog=TUNE_EXAMPLES,
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
                      "recommendation (TOML or JSON by extension; default gputune.toml; a file "
                      "there is kept as FILE.1, FILE.2, ...); the report is written beside it, "
                      "with the date and time in its name")
    add_format_option(tune, "--out")
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
    return tune


def _misplaced_option(parser: Parser, argv: list[str]) -> str | None:
    """Why an option before the command belongs after it (`gputune --steps 5 bench`), or None.
    argparse alone would read its value as the command."""
    commands = parser.commands
    command = next((a for a in argv if a in commands), None)
    for arg in argv[:argv.index(command)] if command else argv:
        flag = arg.partition("=")[0]
        if not flag.startswith("--") or flag == "--" or parser.takes(flag):
            continue
        takers = [name for name, p in commands.items() if p.takes(flag)]
        if not takers:
            continue
        where = command if command in takers else takers[0]
        without = "" if command else ", not of the dashboard"
        return (f"{flag} is an option of {' and '.join(takers)}{without}: give it after the "
                f"command, e.g. gputune {where} {flag} ...")
    return None


def _given_once(flag: str, command: str, before, after):
    """The value of an option given before the command or after it, or UsageError where the
    two say different things."""
    if before is not None and after is not None and before != after:
        raise UsageError(f"{flag} is given twice, {before} before {command} and {after} after "
                         "it: give it once")
    return after if after is not None else before


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the options given before the command applied to it, as git does
    (`gputune --device cuda bench` benches on CUDA), or UsageError in one line for an option
    given twice with two values or one the command does not take."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    misplaced = _misplaced_option(parser, argv)
    if misplaced:
        raise UsageError(misplaced)
    args = parser.parse_args(argv)
    command = args.command
    for key, default in RUN_OPTIONS.items():
        value = _given_once("--" + key.replace("_", "-"), command,
                            getattr(args, BEFORE + key, None), getattr(args, key, None))
        setattr(args, key, default if value is None else value)
    config, max_memory = args.before_config, args.before_max_memory
    if command is None:
        args.config, args.max_memory = config, max_memory
    elif command == "bench":
        if max_memory is not None:
            raise UsageError("--max-memory does not apply to bench: it is the memory budget of "
                             "tune and of the dashboard's memory panel")
        args.config = ([config] if config else []) + args.config
    elif command == "tune":
        if config is not None:
            raise UsageError("--config does not apply to tune, which searches from the fp32 "
                             "baseline: to measure that file beside the search, give --compare "
                             f"{config}")
        args.max_memory = _given_once("--max-memory", command, max_memory, args.max_memory)
    return args


def parse_overrides(items: list[str]) -> dict:
    return parse_assignments(items)


def check_run_options(args) -> None:
    if args.device not in DEVICES:
        raise UsageError(f"unknown device {args.device!r}: allowed devices are cuda, cpu, auto")
    if args.data is not None:
        try:
            open_regular(args.data, f"--data file {args.data}").close()
        except ReadError as exc:
            raise UsageError(f"{exc} (a text file is wanted)") from None
    if args.seq_len is not None and not 1 <= args.seq_len <= 2**24:
        raise UsageError(f"--seq-len {args.seq_len} is out of range: an integer from 1 to {2**24}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed {args.seed} is out of range: an integer from 0 to {MAX_SEED}")
    name = args.workload
    builtin = {"auto", "gpt2-tiny", "gpt2-124m", "gpt2-350m", "llama-tiny", "llama-1b"}
    if name in builtin:
        return
    if workload_kinds.kind_of(name):
        problem = workload_kinds.check(name, args.seq_len, args.data)
        if problem:
            raise UsageError(problem)
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


def shown(text: str, limit: int = 40) -> str:
    """A user's value for a message, cut short if it is long (a 5,000-digit number)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit // 2]!r}... ({len(text)} characters)"


def parse_memory_budget(text: str) -> int:
    """--max-memory in bytes; UsageError naming the allowed sizes."""
    from tuner_tui.engine.search.memory import parse_bytes  # torch-free

    try:
        value = parse_bytes(text)
    except (ValueError, OverflowError):
        value = 0
    if not 0 < value <= MAX_MEMORY_BYTES:
        raise UsageError(f"--max-memory {shown(text)} is not a size from 1 B to 1 EiB: a number "
                         "with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. "
                         "40GiB")
    return value


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
                      log_path=str(new_run_log(getattr(args, "command", None) or "dashboard")))


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


def cmd_bench(args) -> int:
    from tuner_tui.engine import bench, runner, table
    from tuner_tui.engine.noise import noise_lines

    check_run_options(args)
    check_measure_options(args)
    check_output(args.json, "--json")
    check_output(args.export, "--export", config_file=True)
    trainers = check_formats(args, args.export, "--export")
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
        # After each row, so that a bench cut short keeps what it measured; a failure here is
        # tried again (and reported) at the end.
        write_all([("--json", lambda: bench.write_json(args.json, results, environment,
                                                       workload, plan))])

    from tuner_tui.engine.store import open_store

    store = open_store(args.store)
    interrupted = False
    try:
        results, environment, workload = bench.run_bench(
            plan, out=sys.stdout, strict=strict, on_result=save_rows if args.json else None,
            store=store,
        )
    except bench.Interrupted as stop:
        if not stop.results:
            raise
        results, environment, workload, interrupted = (
            stop.results, stop.environment, stop.workload, True)
        print("\ninterrupted: the rows measured so far are reported")
    except runner.WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
    print("\n" + describe_run(workload, environment))
    print(table.format_table(results, item_name=workload.get("item_name", "tokens")))
    for line in noise_lines(results):
        print(line)
    if plan.profile_steps:
        print(table.format_profiles(results))
    print_worker_warnings(plan.spec)
    top, verdict = runner.best(results), None
    if args.export and not interrupted:
        try:
            top, verdict = bench.remeasure_best(plan, results, out=sys.stdout)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: the leaders were not re-measured")
        if verdict is not None:
            print(verdict.text())
    outputs = []
    if args.json:
        outputs.append((f"--json {args.json}", f"wrote {args.json}", lambda: bench.write_json(
            args.json, results, environment, workload, plan, verdict)))
    if args.export and top is not None:
        exported = ExportedConfig(top.tune_config, top.measured(), environment, workload["name"])
        outputs.append((f"--export {args.export}", lambda written: print_written(written, top.label),
                        lambda: exports.write_with_trainers(exported, args.export, trainers)))
    problems = write_outputs(outputs)
    say_not_written(problems)
    if interrupted:
        raise KeyboardInterrupt
    if args.export and top is None:
        print("no configuration ran with a matching loss; nothing exported", file=sys.stderr)
        return 1
    if problems:
        return EXIT_NOT_WRITTEN
    return 0 if any(r.status == "ok" for r in results) else 1


def cmd_tune(args) -> int:
    from tuner_tui.engine import runner, search
    from tuner_tui.engine.store import open_store

    check_run_options(args)
    check_measure_options(args)
    if not args.budget_minutes >= 0:  # NaN too
        raise UsageError(f"--budget-minutes {args.budget_minutes:g} is out of range: a number of "
                         "minutes > 0 (0 or inf: no limit)")
    check_output(args.out, "--out", config_file=True)
    trainers = check_formats(args, args.out, "--out")
    check_output(args.json, "--json")
    check_batch_multiples(args.choices)
    max_memory = None if args.max_memory is None else parse_memory_budget(args.max_memory)
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
    store = open_store(args.store)
    try:
        outcome = search.Search(plan, store).run()
    except runner.WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
    environment, workload = outcome.environment, outcome.workload
    where = " (in memory)" if store.in_memory else ""
    text = f"{describe_run(workload, environment)}; store {store.path}{where}\n{search.report(outcome)}"
    print("\n" + text)
    print_worker_warnings(plan.spec)
    problems = write_tune_outputs(args, outcome, text, trainers)
    say_not_written(problems)
    if outcome.interrupted:  # reported and written: then the usual exit of an interrupted run
        raise KeyboardInterrupt
    if outcome.error:
        print(f"gputune: the search stopped early on an internal error: {outcome.error}",
              file=sys.stderr)
        return EXIT_SEARCH_ERROR
    if outcome.recommendation is None:
        print("nothing exported", file=sys.stderr)
        return 1
    return EXIT_NOT_WRITTEN if problems else 0


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
    budget = None if args.max_memory is None else parse_memory_budget(args.max_memory)
    if args.device == "cuda":
        problem = cuda_problem()
        if problem:
            raise UsageError(f"--device cuda: {problem}: allowed devices here are cpu, auto")
    from tuner_tui.app import run_dashboard

    return run_dashboard(worker_spec(args), start, budget)


STOP_WATCHDOG_S = 30.0
"""After an interrupt, the orderly stop (each worker asked, then terminated, then killed: a few
seconds each) gets this long; past it, a watchdog kills the workers and gputune exits 130 (a
CI run once saw gputune sleep for a minute after Ctrl-C on a loaded host)."""
_watchdog: threading.Timer | None = None


def _stop_by_force() -> None:
    with contextlib.suppress(Exception):
        import psutil  # (here: the CLI itself imports nothing outside the standard library)

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(Exception):
        print(f"gputune: the workers did not stop within {STOP_WATCHDOG_S:.0f} s of the "
              "interrupt: killed", file=sys.stderr)
        print("gputune: interrupted", file=sys.stderr)
        sys.stderr.flush()
    os._exit(130)


def _raise_interrupt(signum, frame):
    global _watchdog
    if _watchdog is None:
        _watchdog = threading.Timer(STOP_WATCHDOG_S, _stop_by_force)
        _watchdog.daemon = True
        _watchdog.start()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # Before anything prints or binds sys.stdout (a default argument such as `out=sys.stdout`
    # binds it at import): a closed terminal then costs the printing, never the results.
    global _watchdog
    with terminal_streams():
        try:
            return _main(argv)
        finally:  # stopped in order: the watchdog has nothing to do
            if _watchdog is not None:
                _watchdog.cancel()
                _watchdog = None


def _main(argv: list[str] | None) -> int:
    # SIGTERM and SIGHUP (the terminal closed) take the same path as Ctrl-C, so `finally`
    # blocks stop the worker processes and multiprocessing removes its semaphores. A SIGHUP
    # the user ignored (`nohup gputune tune ...`) stays ignored, so the search outlives the
    # terminal, as a SIGINT ignored by the shell (a background job) does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    for signum in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise_interrupt)
    try:
        args = parse_args(argv)
        knob_problems = kernel_knobs.problems()  # read by the kernels in the worker: check first
        if knob_problems:
            raise UsageError(knob_problems[0])
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "tune":
            return cmd_tune(args)
        return cmd_dashboard(args)
    except (UsageError, ConfigError, ReadError) as exc:
        print(f"gputune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gputune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

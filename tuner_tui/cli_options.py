"""The `gputune` command line: its parsers (options before the subcommand apply to it, git's
way), the examples in each `--help`, and the checks every option passes before anything is
measured: a bad value is a `UsageError`, one line that names it and the allowed values. Imports
no torch."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from strategies import exports
from strategies.config import ConfigError, format_of, parse_assignments, read
from strategies.files import ReadError, WriteError, check_writable, open_regular
from strategies.registry import MAX_BATCH_SIZE, OPTIONS
from tuner_tui import __version__
from tuner_tui.engine import remeasure, workload_kinds
from tuner_tui.engine.paths import module_exists

DEVICES = ("auto", "cuda", "cpu")
PROFILE_STEPS = 3
"""Steps a profile summarizes (the same as profiler.PROFILE_STEPS, which imports torch)."""
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
        # argparse's "invalid int value: 'x'" names neither what is allowed nor in words.
        message = re.sub(r"invalid int value: ('.*')", r"\1 is not allowed: a whole number",
                         message)
        message = re.sub(r"invalid float value: ('.*')", r"\1 is not allowed: a number",
                         message)
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
    add_trust_options(bench, "before --export names the best, the two leaders (when close) are",
                      remeasure.REPEATS)
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


def add_trust_options(p: argparse.ArgumentParser, who: str, repeats: int) -> None:
    p.add_argument("--fresh", action="store_true", help="measure every configuration again "
                   "instead of reusing results stored by this code on this machine (the new "
                   "results are still stored)")
    p.add_argument("--remeasure", type=int, default=repeats, metavar="N",
                   help=f"{who} re-measured N times each, interleaved, each run in a fresh "
                        "process; a difference within the spread is a tie, won by the simpler "
                        f"configuration (default {repeats}; 0: off)")


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
                      "trial starts that would leave too little to re-measure them, and one "
                      "still running a tenth of it past its end is stopped (default 10; 0: no "
                      "limit)")
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
                      help="the longest a trial may run (default 900); one whose worker stops "
                      "showing progress (a step, or a part of one) for about three times what "
                      "the trial was expected to take is stopped sooner, as hung")
    add_trust_options(tune, "after the search, the two leaders (when close; under a time budget, "
                      "unless a trial expects more per second) are",
                      remeasure.SEARCH_REPEATS)
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

"""The `gputune` command: the dashboard by default, `bench` and `tune` headless.

User errors (bad flags, bad configuration files, a workload that does not import) print one
line that names the problem and the allowed values, and exit with code 2. An output file that
cannot be written at the end of a run costs only that file: the others are written, one line
names what was not, and the exit code is 3. A closed terminal or pipe costs only the printing.
The options and their checks live in `cli_options`, the outputs in `cli_outputs`, the stop on
an interrupt in `cli_stop`. This module imports no torch; the worker processes do.
"""

from __future__ import annotations

import math
import subprocess
import sys

from strategies import exports
from strategies.config import ConfigError, ExportedConfig, read
from strategies.files import ReadError, write_all
from tuner_tui import cli_stop
from tuner_tui.cli_options import (  # noqa: F401  (UsageError, build_parser, parse_args: tests use them here)
    UsageError, build_parser, check_batch_multiples, check_formats, check_measure_options,
    check_output, check_run_options, parse_args, parse_memory_budget, parse_overrides,
    profile_steps,
)
from tuner_tui.cli_outputs import (  # noqa: F401  (describe_run: tests use it here)
    describe_run, print_worker_warnings, print_written, say_not_written, write_outputs,
    write_tune_outputs,
)
from tuner_tui.engine import kernel_knobs
from tuner_tui.engine.paths import compile_cache_environ
from tuner_tui.terminal import terminal_streams

EXIT_USAGE = 2
EXIT_NOT_WRITTEN = 3
"""The run ended, but an output it was asked for (--json, --export, --out) could not be
written; the line before the exit says which and why."""
EXIT_SEARCH_ERROR = 4
"""`tune` stopped early on an error of its own: what it measured was reported, written and
exported all the same; the report names the error."""


def worker_spec(args):
    from tuner_tui.engine.protocol import WorkerSpec
    from tuner_tui.engine.worker_log import new_run_log

    # The workers' output goes to this run's log, not the terminal (engine/worker_log.py).
    return WorkerSpec(workload=args.workload, device=args.device, data=args.data,
                      seed=args.seed, sequence_length=args.seq_len,
                      environ=tuple(compile_cache_environ().items()),
                      log_path=str(new_run_log(getattr(args, "command", None) or "dashboard")))


def cmd_bench(args) -> int:
    from tuner_tui.engine import bench, runner, table
    from tuner_tui.engine.noise import noise_lines
    from tuner_tui.engine.search.report import WORKLOAD_ERROR_SOURCE, workload_error

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
    error = workload_error(results)
    if error:
        print(f"every row raised the fp32 row's error (your model and code as written): {error}; "
              f"{WORKLOAD_ERROR_SOURCE}")
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


def main(argv: list[str] | None = None) -> int:
    # Before anything prints or binds sys.stdout (a default argument such as `out=sys.stdout`
    # binds it at import): a closed terminal then costs the printing, never the results.
    with terminal_streams():
        try:
            return _main(argv)
        finally:  # stopped in order: the watchdog has nothing to do
            cli_stop.cancel_watchdog()


def _main(argv: list[str] | None) -> int:
    cli_stop.install_handlers()
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

"""`gputune bench`: measure configurations side by side, each in a fresh worker process.

The parent process imports no torch: it validates the configurations, starts one worker per
configuration (so no configuration inherits another's compiled graphs, allocator state or
global flags), shows progress, and prints and saves the table. Running one trial is
`runner.run_one`; the table is `table.format_table`. Every row is recorded in the result store,
and a row measured before with the same code, machine and steps is reused unless `fresh`. Before
`--export` names the best, the two leaders are re-measured interleaved (`remeasure.py`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Mapping, TextIO

from strategies.applicability import distinct, inapplicable_options
from strategies.config import ConfigError, TuneConfig
from strategies.files import write_atomic
from strategies.registry import Capabilities
from tuner_tui.engine import protocol, remeasure
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.reference import (
    LOSS_CHECK_STEPS, computes_reference, reference_configs, reference_key,
)
from tuner_tui.engine.runner import (
    NextWorker, TrialPlan, best, run_one, runnable, start_worker, trace_path,
)
from tuner_tui.engine.search.memory import estimate, prior_estimate
from tuner_tui.engine.store import REUSABLE, ResultStore, workload_key
from tuner_tui.engine.table import summary


def ladder() -> list[TuneConfig]:
    """The default set: the baseline (fp32 eager, manual attention), then one strategy family
    added at a time. Rows this machine cannot run are dropped by `runnable`."""
    steps = [
        {},
        {"precision": "tf32"},
        {"precision": "bf16"},
        {"precision": "bf16", "attention": "sdpa"},
        {"precision": "bf16", "attention": "sdpa", "compile_mode": "default"},
        {"precision": "bf16", "attention": "sdpa", "compile_mode": "default", "optimizer": "fused"},
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "reduce-overhead",
            "optimizer": "fused",
        },
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "default",
            "optimizer": "fused",
            "fused_kernels": ["layer_norm", "gelu", "rms_norm", "swiglu", "linear_cross_entropy"],
        },
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "default",
            "optimizer": "fused",
            "checkpointing": "selective",
        },
    ]
    return [TuneConfig.from_dict(s) for s in steps]


def _best_known() -> dict:
    return {"precision": "bf16", "attention": "sdpa", "compile_mode": "default", "optimizer": "fused"}


PRESETS: dict[str, Callable[[], list[TuneConfig]]] = {
    "ladder": ladder,
    "quick": lambda: [
        TuneConfig.from_dict({}),
        TuneConfig.from_dict({"precision": "bf16", "attention": "sdpa", "optimizer": "foreach"}),
    ],
    "compile-modes": lambda: [
        TuneConfig.from_dict({**_best_known(), "compile_mode": mode})
        for mode in ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
    ],
    "checkpointing": lambda: [
        TuneConfig.from_dict({**_best_known(), "checkpointing": c})
        for c in ("off", "selective", "every-n", "full")
    ],
    "kernels": lambda: [
        TuneConfig.from_dict({**_best_known(), "compile_mode": "off"}),
        TuneConfig.from_dict(
            {**_best_known(), "compile_mode": "off",
             "fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"]}
        ),
        TuneConfig.from_dict(_best_known()),
        TuneConfig.from_dict(
            {**_best_known(),
             "fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"]}
        ),
    ],
}


@dataclass
class BenchPlan:
    spec: WorkerSpec
    configs: list[TuneConfig]
    steps: int = 20
    warmup_steps: int = 5
    trial_timeout_s: float = 900.0
    overrides: dict = field(default_factory=dict)
    remeasure_repeats: int = remeasure.REPEATS
    """Interleaved runs of each of the two leaders before `--export` names the best; 0: none."""
    fresh: bool = False
    """Measure every row again instead of reusing the store's."""
    profile_steps: int = 0
    """Steps profiled after each row's measured ones (`--profile`); 0: none."""
    trace_dir: str | None = None

    def trial_plan(self, index: int = 0, config: TuneConfig | None = None) -> TrialPlan:
        trace = trace_path(self.trace_dir, index, config) if config is not None else None
        return TrialPlan(self.steps, self.warmup_steps, self.trial_timeout_s,
                         self.profile_steps, trace)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP (the CLI raises KeyboardInterrupt for all three) during a
    bench, with the rows measured until then, so that they are reported and written."""

    def __init__(self, results: list[protocol.TrialResult], environment: dict,
                 workload: dict) -> None:
        super().__init__()
        self.results, self.environment, self.workload = results, environment, workload


def apply_overrides(configs: list[TuneConfig], overrides: dict) -> list[TuneConfig]:
    return [c.replace(**overrides) for c in configs] if overrides else configs


def caps_allow(config: TuneConfig, caps: Capabilities) -> bool:
    """True when this machine can run `config`, whatever its batch."""
    try:
        config.check_runnable(caps)
        return True
    except ConfigError:
        return False


def _reference_losses(client, next_worker: NextWorker, config: TuneConfig, batch: int,
                      index: int, total: int, progress: Progress,
                      inapplicable: Collection[str] = (),
                      ran_here: Mapping[str, protocol.TrialResult] | None = None):
    """The fp32 reference's losses for `config`'s batch and clipping, and the worker to go on
    with: plain, then checkpointed, then in ever smaller micro-batches down to one sample where
    the one before ran out of memory, as tune tries them. () where none ran to the end: the
    losses of a run that failed part way are not a reference (a 1.5B Llama's fp32 run, out of
    memory on an H100 after its first steps, had every row of its bench marked "ok" against
    those alone). A rung is run as the model tells it apart (`inapplicable`: SDPA without
    attention is the fp32 baseline), once, and not where this bench ran it already
    (`ran_here`, by its configuration's JSON): an MLP's baseline that crashed was run again."""
    for reference in dict.fromkeys(r.without(inapplicable) for r in reference_configs(config)):
        before = (ran_here or {}).get(json.dumps(reference.to_dict(), sort_keys=True))
        if before is not None:
            if before.status != "oom":
                break
            continue
        how = "".join(part for part, used in (
            (", full checkpointing", reference.checkpointing == "full"),
            (", one sample at a time", reference.micro_batch_size == 1),
            (f", micro-batches of {reference.micro_batch_size}", reference.micro_batch_size > 1))
            if used)
        progress.begin(index, total, f"fp32 reference losses (batch {batch}{how})")
        next_worker.begin(client)
        ref = run_one(client, reference,
                      TrialPlan(steps=1, warmup_steps=LOSS_CHECK_STEPS - 1), (), progress)
        ran = ref.status == "ok" and bool(ref.losses)
        progress.end(f"{len(ref.losses)} losses" if ran else ref.status)
        client.stop()
        client, _ = next_worker.take()
        if ran:
            return tuple(ref.losses), client
        if ref.status != "oom":
            break
    return (), client


def run_bench(
    plan: BenchPlan,
    out: TextIO = sys.stdout,
    strict: bool = True,
    on_result: Callable[[list[protocol.TrialResult], dict, dict], None] | None = None,
    store: ResultStore | None = None,
) -> tuple[list[protocol.TrialResult], dict, dict]:
    """Measure every configuration of the plan. Returns (results, environment, workload).

    With strict (configurations the user named), a configuration this machine cannot run is a
    ConfigError before anything runs; otherwise (presets) such rows are skipped with a note.
    `on_result(results so far, environment, workload)` is called after each row, so that a
    bench cut short (a timeout, a killed terminal) keeps the rows it measured. With a `store`,
    rows are recorded there and (unless `plan.fresh`) reused from it. Interrupted once the
    worker is up, it raises `Interrupted` with the rows measured so far.
    """
    progress = Progress(out)
    client, ready = start_worker(plan.spec)
    caps = Capabilities(**ready.capabilities)
    configs = apply_overrides(plan.configs, plan.overrides)
    default_batch = ready.workload["default_batch_size"]
    try:
        if strict:
            for config in configs:
                config.check_runnable(caps)
                # (the workload's default batch is known only now, from the worker)
                config.accumulation_steps(config.batch_size or default_batch)
        else:
            first = configs[0]
            configs, skipped = runnable(configs, caps, default_batch)
            if not configs:
                # Name the device only where it is the cause (not a batch the devices or the
                # micro-batch do not divide).
                where = (f"on device = {caps.device}" if not caps_allow(first, caps)
                         else "with this batch")
                raise ConfigError(f"no configuration can run {where}: "
                                  + skipped[0].partition(": ")[2])
            for line in skipped:
                print(f"skipped {line}", file=out)
    except ConfigError:
        client.stop()
        raise
    workload = ready.workload
    inapplicable = inapplicable_options(workload)
    if not strict:  # a preset's rung that only adds what this model has no use for
        configs, same = distinct(configs, inapplicable)
        for line in same:
            print(f"skipped {line}", file=out)
    references: dict[tuple[int, float], tuple[float, ...]] = {}
    results: list[protocol.TrialResult] = []
    total = len(configs)
    next_worker = NextWorker(plan.spec)
    # Each row of this run by its configuration's JSON. A configuration listed twice is a
    # repeat the user asked for: measured again, not taken from the row this run has just
    # stored; a rung of the reference's ladder that is a row already decides as it did.
    ran_here: dict[str, protocol.TrialResult] = {}
    shutdown_s = 5.0  # how long the last worker is asked to shut down before it is terminated
    try:
        for index, config in enumerate(configs, start=1):
            key = reference_key(config, default_batch)
            config_key = json.dumps(config.to_dict(), sort_keys=True)
            repeat = config_key in ran_here
            stored = None if repeat else _stored(store, plan, config, ready)
            if stored is None and key not in references and not computes_reference(config):
                references[key], client = _reference_losses(
                    client, next_worker, config, key[0], index, total, progress, inapplicable,
                    ran_here)
            progress.begin(index, total, config.label(skip=inapplicable))
            item_name = workload.get("item_name", "tokens")
            if stored is not None:
                result = stored
                progress.end("reused from the store (--fresh measures again): "
                             + summary(result, item_name))
            else:
                if index < total:
                    next_worker.begin(client)
                try:
                    estimated = estimate(config, results, default_batch)
                except Exception:  # an estimate that cannot be made never stops a bench
                    estimated = None
                result = run_one(client, config, plan.trial_plan(index, config),
                                 references.get(key, ()), progress, inapplicable=inapplicable)
                if estimated is None:  # nothing measured before it: from what its worker counted
                    estimated = prior_estimate(config, result, default_batch)
                if estimated is not None:
                    result = replace(result, memory_estimate=estimated.to_dict())
                if store is not None:
                    store.record(result, ready.environment, workload_key(workload), plan.steps,
                                 plan.warmup_steps, source="bench")
            if computes_reference(config) and result.status == "ok":
                references.setdefault(key, tuple(result.losses[:LOSS_CHECK_STEPS]))
            results.append(result)
            ran_here[config_key] = result
            if stored is None:
                progress.end(summary(result, item_name))
            if on_result is not None:
                on_result(results, ready.environment, workload)
            if stored is None:
                client.stop()
                if index < total:
                    client, _ = next_worker.take()
    except KeyboardInterrupt:
        # A worker in a trial reads no Shutdown until the trial ends: asked for a second, not
        # five, then terminated (the whole stop has STOP_WATCHDOG_S).
        shutdown_s = 1.0
        raise Interrupted(results, ready.environment, workload) from None
    finally:
        client.stop(timeout=shutdown_s)
        next_worker.close()
    return results, ready.environment, workload


def _stored(store: ResultStore | None, plan: BenchPlan, config: TuneConfig,
            ready: protocol.WorkerReady) -> protocol.TrialResult | None:
    if store is None or plan.fresh:
        return None
    found = store.lookup(workload_key(ready.workload), config.to_dict(), plan.steps,
                         plan.warmup_steps, ready.environment)
    if found is None or found.result.status not in REUSABLE:
        return None
    if plan.profile_steps and found.result.status == "ok" and not found.result.profile:
        return None  # --profile: a row stored without a profile is measured again, with one
    return found.result


def remeasure_best(
    plan: BenchPlan, results: list[protocol.TrialResult], out: TextIO = sys.stdout,
) -> tuple[protocol.TrialResult | None, remeasure.Verdict | None]:
    """The best row, after re-measuring the two leaders interleaved (each run in a fresh
    worker, few steps) when they lie close enough that one measurement cannot order them."""
    eligible = [r for r in results if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False]
    leading = remeasure.leaders(eligible, limit=2)
    if plan.remeasure_repeats < 1 or len(leading) < 2:
        return best(results), None
    progress = Progress(out)
    labels = {json.dumps(r.config, sort_keys=True): r.label for r in results}
    trial = TrialPlan(remeasure.repeat_steps(plan.steps), plan.warmup_steps, plan.trial_timeout_s)
    next_worker = NextWorker(plan.spec)
    client = None

    def run(config: TuneConfig, index: int, total: int) -> protocol.TrialResult:
        nonlocal client
        client, _ = next_worker.take()  # started beside the last run; at first, now
        label = labels.get(json.dumps(config.to_dict(), sort_keys=True)) or config.label()
        progress.begin(index, total, label, "re-measuring the leaders, interleaved")
        next_worker.begin(client)  # a third round may follow the last: a worker stands ready
        result = run_one(client, config, trial, (), progress)
        progress.end(summary(result))
        client.stop()
        client = None
        return result

    try:
        verdict = remeasure.remeasure(leading, run, plan.remeasure_repeats)
    finally:
        if client is not None:
            client.stop()
        next_worker.close()
    if verdict is None or verdict.winner is None:
        return best(results), verdict
    return verdict.winner, verdict


def write_json(path: str | Path, results, environment: dict, workload: dict, plan: BenchPlan,
               remeasured: remeasure.Verdict | None = None) -> None:
    doc = {
        "tool": "gputune bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": workload,
        "steps": plan.steps,
        "warmup_steps": plan.warmup_steps,
        "environment": environment,
        "results": [r.to_dict() for r in results],
        "remeasured": remeasured.to_dict() if remeasured is not None else None,
    }
    write_atomic(path, json.dumps(doc, indent=2) + "\n")

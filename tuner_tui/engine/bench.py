"""`gputune bench`: measure configurations side by side, each in a fresh worker process.

The parent process imports no torch: it validates the configurations, starts one worker per
configuration (so no configuration inherits another's compiled graphs, allocator state or
global flags), shows progress, and prints and saves the table. Running one trial is
`runner.run_one`; the table is `table.format_table`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import protocol
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.reference import (
    LOSS_CHECK_STEPS, computes_reference, reference_configs, reference_key,
)
from tuner_tui.engine.runner import (
    NextWorker, TrialPlan, run_one, runnable, start_worker, trace_path,
)
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
    profile_steps: int = 0
    """Steps profiled after each row's measured ones (`--profile`); 0: none."""
    trace_dir: str | None = None

    def trial_plan(self, index: int = 0, config: TuneConfig | None = None) -> TrialPlan:
        trace = trace_path(self.trace_dir, index, config) if config is not None else None
        return TrialPlan(self.steps, self.warmup_steps, self.trial_timeout_s,
                         self.profile_steps, trace)


def apply_overrides(configs: list[TuneConfig], overrides: dict) -> list[TuneConfig]:
    return [c.replace(**overrides) for c in configs] if overrides else configs


def run_bench(
    plan: BenchPlan,
    out: TextIO = sys.stdout,
    strict: bool = True,
    on_result: Callable[[list[protocol.TrialResult], dict, dict], None] | None = None,
) -> tuple[list[protocol.TrialResult], dict, dict]:
    """Measure every configuration of the plan. Returns (results, environment, workload).

    With strict (configurations the user named), a configuration this machine cannot run is a
    ConfigError before anything runs; otherwise (presets) such rows are skipped with a note.
    `on_result(results so far, environment, workload)` is called after each row, so that a
    bench cut short (a timeout, a killed terminal) keeps the rows it measured.
    """
    progress = Progress(out)
    client, ready = start_worker(plan.spec)
    caps = Capabilities(**ready.capabilities)
    configs = apply_overrides(plan.configs, plan.overrides)
    if strict:
        for config in configs:
            config.check_runnable(caps)
    else:
        configs, skipped = runnable(configs, caps)
        for line in skipped:
            print(f"skipped {line}", file=out)
    workload = ready.workload
    default_batch = workload["default_batch_size"]
    references: dict[tuple[int, float], tuple[float, ...]] = {}
    results: list[protocol.TrialResult] = []
    total = len(configs)
    next_worker = NextWorker(plan.spec)
    try:
        for index, config in enumerate(configs, start=1):
            key = reference_key(config, default_batch)
            if key not in references and not computes_reference(config):
                progress.begin(index, total, f"fp32 reference losses (batch {key[0]})")
                next_worker.begin(client)
                ref = run_one(
                    client, reference_configs(config)[0],
                    TrialPlan(steps=1, warmup_steps=LOSS_CHECK_STEPS - 1), (), progress,
                )
                references[key] = tuple(ref.losses)
                progress.end(f"{len(ref.losses)} losses" if ref.status == "ok" else ref.status)
                client.stop()
                client, _ = next_worker.take()
            progress.begin(index, total, config.label())
            if index < total:
                next_worker.begin(client)
            result = run_one(client, config, plan.trial_plan(index, config), references.get(key, ()),
                             progress)
            if computes_reference(config) and result.status == "ok":
                references.setdefault(key, tuple(result.losses[:LOSS_CHECK_STEPS]))
            results.append(result)
            progress.end(summary(result))
            if on_result is not None:
                on_result(results, ready.environment, workload)
            client.stop()
            if index < total:
                client, _ = next_worker.take()
    finally:
        client.stop()
        next_worker.close()
    return results, ready.environment, workload


def write_json(path: str | Path, results, environment: dict, workload: dict, plan: BenchPlan) -> None:
    doc = {
        "tool": "gputune bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": workload,
        "steps": plan.steps,
        "warmup_steps": plan.warmup_steps,
        "environment": environment,
        "results": [r.to_dict() for r in results],
    }
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)

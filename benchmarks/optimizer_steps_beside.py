"""Does the optimizer steps' worker disturb the trial it runs beside? (`runner.OptimizerStepWarmup`)

One trial's configuration is measured in a fresh worker, alone and while torchao's AdamW steps
compile in a worker of their own (niced, as the search runs it, from a cold Inductor cache of
its own so that it compiles throughout), interleaved A B B A ... Then, in the same call, how
long the model's own first step with torchao takes in a fresh worker after that worker has
compiled its pair, against one from a cold cache. Run on the GPU machine from the repository
root (benchmarks/gpu_env.sh sourced):

    python3 benchmarks/optimizer_steps_beside.py --workload gpt2-124m --rounds 3 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from strategies.config import TuneConfig
from tuner_tui.engine import noise, protocol
from tuner_tui.engine.paths import compile_cache_environ
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.runner import OptimizerStepWarmup, start_worker

VARIANTS = (("bf16", "fp32"), ("bf16", "bf16"), ("bf16", "8bit"), ("fp32", "bf16"),
            ("fp32", "8bit"))


def measure(spec: WorkerSpec, config: TuneConfig, steps: int) -> protocol.TrialResult:
    client, _ = start_worker(spec)
    try:
        client.send(protocol.RunTrial(config, steps=steps, warmup_steps=5, max_steps=steps))
        while True:
            event = client.wait_event(600)
            if event is None:
                raise RuntimeError("no event within 600 s")
            if isinstance(event, protocol.TrialFinished):
                return event.result
            if isinstance(event, protocol.RunFailed):
                raise RuntimeError(event.message)
    finally:
        client.stop()


def cold_environ() -> dict:
    """A worker environment with an Inductor cache of its own, empty."""
    return {**compile_cache_environ(), "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(
        prefix="inductor-cold-")}


def beside(args, spec: WorkerSpec, config: TuneConfig) -> list[dict]:
    rows = []
    order = [m for r in range(args.rounds) for m in (("alone", "beside") if r % 2 == 0
                                                     else ("beside", "alone"))]
    for mode in order:
        warmup = None
        if mode == "beside":
            other = WorkerSpec(workload=args.workload, device="cuda",
                               environ=tuple(cold_environ().items()))
            warmup = OptimizerStepWarmup(other, VARIANTS)
            warmup.started.wait(300)
            time.sleep(3.0)  # its compile under way
        try:
            result = measure(spec, config, args.steps)
            still = warmup is not None and len(warmup.done()) < len(VARIANTS)
        finally:
            if warmup is not None:
                warmup.close()
        rows.append({"mode": mode, "tokens_per_s": result.tokens_per_s,
                     "step_ms": result.step_ms, "spread": noise.spread(result),
                     "compiling_throughout": still if warmup is not None else None})
        print(f"{mode:7} {result.tokens_per_s:10.0f} tokens/s  step {result.step_ms:.2f} ms"
              + ("" if warmup is None else f"  (compiling throughout: {still})"), flush=True)
    return rows


def first_step(args, config: TuneConfig) -> dict:
    """The model's first step with torchao (`config`) in a fresh worker: from a cold cache,
    then from one the optimizer steps' worker filled."""
    out = {}
    cold = WorkerSpec(workload=args.workload, device="cuda", environ=tuple(cold_environ().items()))
    out["cold_first_step_s"] = measure(cold, config, 5).compile_s
    warm_env = tuple(cold_environ().items())
    variant = (config.weights, config.optimizer_state)
    warmup = OptimizerStepWarmup(WorkerSpec(workload=args.workload, device="cuda",
                                            environ=warm_env), (variant,))
    deadline = time.monotonic() + 300
    while variant not in warmup.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    out["optimizer_steps_worker_s"] = warmup.done().get(variant)
    warmup.close()
    warm = WorkerSpec(workload=args.workload, device="cuda", environ=warm_env)
    out["first_step_after_it_s"] = measure(warm, config, 5).compile_s
    print(f"first step with {config.label()}: cold {out['cold_first_step_s']:.1f} s; the "
          f"worker compiled it in {out['optimizer_steps_worker_s']} s; after it "
          f"{out['first_step_after_it_s']:.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2-124m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    spec = WorkerSpec(workload=args.workload, device="cuda",
                      environ=tuple(compile_cache_environ().items()))
    measured = TuneConfig.from_dict({"precision": "bf16", "attention": "sdpa"})
    rows = beside(args, spec, measured)
    stepped = first_step(args, TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"}))
    summary = {}
    for mode in ("alone", "beside"):
        speeds = [r["tokens_per_s"] for r in rows if r["mode"] == mode]
        summary[mode] = {"median": statistics.median(speeds), "min": min(speeds),
                         "max": max(speeds)}
    sys.path.insert(0, os.path.dirname(__file__))
    from kernels_bench import environment

    doc = {**environment(), "cpus": os.cpu_count(), "workload": args.workload,
           "measured": measured.label(), "variants": VARIANTS, "rows": rows,
           "summary": summary, "first_step": stepped}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

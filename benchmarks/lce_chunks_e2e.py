"""The linear + cross-entropy chunk size inside a whole training step, beside compile alone.

    python3 benchmarks/lce_chunks_e2e.py --workload llama-1b --json out/lce-chunks-llama-1b.json

Issue 3 asks that fused kernels + torch.compile be at least as fast as the faster of the two
alone. Under compile the fused-kernels strategy swaps only the loss (kernels_with_compile =
inductor-first), so the race is our chunked linear + cross-entropy against Inductor's own
matmul + cross-entropy, and its lever is the chunk size: fewer chunks re-read grad_weight fewer
times but hold a larger piece of the logits. Each variant runs in its own process (the chunk
size is read from GPUTUNE_LCE_CHUNK_ROWS when the model is traced), between two runs of compile
alone, so that drift shows. Every variant is the same training step otherwise: bf16 autocast,
SDPA, fused AdamW, torch.compile default, the workload's default batch. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE = dict(precision="bf16", attention="sdpa", optimizer="fused", compile_mode="default")
KERNELS = "rms_norm+swiglu+linear_cross_entropy"


def measure_one(workload_name: str, device: str, kernels: str, steps: int, warmup: int) -> dict:
    """One configuration in this process: build, warm up (compiles), time `steps` steps."""
    from strategies import TuneConfig
    from tuner_tui.engine import environment, workloads
    from tuner_tui.engine.trial import Trainer

    workload = workloads.load(workload_name, device=device)
    config = TuneConfig.from_dict({**BASE, "fused_kernels": [k for k in kernels.split("+") if k != "none"]})
    trainer = Trainer(workload=workload, config=config, device=device, warmup_steps=warmup,
                      device_name=environment.capabilities(device).gpu_name)
    trainer.build()
    for _ in range(warmup + steps):
        trainer.step()
    trainer.finish()
    result = trainer.result()
    trainer.close()
    return dict(
        label=result.label, status=result.status, tokens_per_s=result.tokens_per_s,
        step_ms=result.step_ms, step_ms_min=result.step_ms_min, step_ms_max=result.step_ms_max,
        peak_memory_gib=(result.peak_memory_bytes or 0) / 1024**3, compile_s=result.compile_s,
        swapped=result.strategy_report.get("fused_kernels"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="llama-1b")
    parser.add_argument("--chunks", default="1024,2048,4096,8192",
                        help="chunk rows to measure (comma-separated)")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only to try the script)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", required=True)
    parser.add_argument("--one", choices=["compile", "kernels"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kernels = KERNELS if args.one == "kernels" else "none"
        print(json.dumps(measure_one(args.workload, args.device, kernels, args.steps, args.warmup)))
        return 0

    from tuner_tui.engine import environment

    chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    # Compile alone first and last: the two show the drift over the run.
    variants = [("compile", None)] + [("kernels", rows) for rows in chunks] + [("compile", None)]
    out = dict(env=environment.fingerprint(args.device), workload=args.workload, base=BASE,
               kernels=KERNELS, rows=[])
    for kind, rows in variants:
        env = dict(os.environ)
        env.pop("GPUTUNE_LCE_CHUNK_ROWS", None)
        if rows:
            env["GPUTUNE_LCE_CHUNK_ROWS"] = str(rows)
        proc = subprocess.run(
            [sys.executable, __file__, "--one", kind, "--workload", args.workload, "--device", args.device,
             "--steps", str(args.steps), "--warmup", str(args.warmup), "--json", "-"],
            env=env, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            row = dict(status="failed", message=proc.stderr.strip().splitlines()[-1:])
        else:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        row.update(variant=kind, chunk_rows=rows)
        out["rows"].append(row)
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"{kind:8s} chunk {rows or '-':>5}  {row.get('tokens_per_s', 0) / 1e3:7.1f}k tokens/s  "
              f"{row.get('step_ms', 0):7.2f} ms  peak {row.get('peak_memory_gib', 0):6.2f} GiB  "
              f"{row.get('status')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

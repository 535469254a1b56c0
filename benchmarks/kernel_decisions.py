"""Which fused kernels the fused-kernels strategy keeps on the GPU at hand, and why.

    python benchmarks/kernel_decisions.py                  # from the per-GPU cache (measured if new)
    python benchmarks/kernel_decisions.py --fresh          # measured anew, in a temporary cache
    python benchmarks/kernel_decisions.py --json benchmarks/results/kernel-decisions-h200.json

For each workload and precision, in eager mode: the model built on the GPU, every kernel chosen,
`strategies.apply`, and the report's line per kernel (kept or left, ours against torch, forward +
backward at the model's widths, strategies/kernel_timing.py). The same configuration is applied
a second time to show that the decisions come from the cache (no timing: the apply is fast and
the cache file is unchanged). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strategies  # noqa: E402
from strategies import TuneConfig, kernel_timing  # noqa: E402
from strategies.registry import FUSED_KERNEL_CHOICES  # noqa: E402
from tuner_tui.engine.workloads import load  # noqa: E402

# linear_cross_entropy is never timed (it is swapped for memory) and would hide cross_entropy,
# which replaces the same loss module.
KERNELS = [k for k in FUSED_KERNEL_CHOICES if k != "linear_cross_entropy"]
PRECISIONS = {
    "bf16": {"precision": "bf16"},
    "bf16 weights": {"precision": "bf16", "weights": "bf16"},
    "fp32": {"precision": "fp32"},
}


def _apply(workload: str, changes: dict) -> tuple[dict, float]:
    torch.manual_seed(0)
    build = load(workload).build_model  # (the workload's data draws on the CPU)
    with torch.device("cuda"):
        model = build()
    config = TuneConfig.from_dict({"fused_kernels": KERNELS, **changes})
    torch.cuda.synchronize()
    start = time.perf_counter()
    tuned = strategies.apply(config, model)
    seconds = time.perf_counter() - start
    report = {k: v for k, v in tuned.report.items() if k.startswith("fused_kernels")}
    del tuned, model
    torch.cuda.empty_cache()
    return report, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="gpt2-124m,llama-1b",
                        help="comma-separated built-in workloads (default: gpt2-124m,llama-1b)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help=f"comma-separated, from {', '.join(PRECISIONS)}")
    parser.add_argument("--fresh", action="store_true", help="measure anew in a temporary cache")
    parser.add_argument("--json", type=Path, help="also write the decisions here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_decisions: needs a CUDA GPU (the decisions are made from GPU timings)")
        return 2
    unknown = [p for p in args.precisions.split(",") if p not in PRECISIONS]
    if unknown:
        print(f"--precisions: unknown {', '.join(unknown)}; allowed: {', '.join(PRECISIONS)}")
        return 2
    if args.fresh:
        os.environ["GPUTUNE_HOME"] = tempfile.mkdtemp(prefix="gputune-timings-")
    path = kernel_timing.default_path()
    from gputune_kernels import _native

    _native.wait(timeout=600)  # as the strategy does before it times: the machine key says so
    machine = kernel_timing.machine_here(torch.device("cuda"))
    print(f"{machine['gpu']}, driver {machine['driver']}, torch {machine['torch']}, "
          f"triton {machine['triton']}, code {machine['code']}, C++ nodes {machine['native']}; cache {path}")
    rows = []
    for workload in args.workloads.split(","):
        for precision in args.precisions.split(","):
            report, first_s = _apply(workload, PRECISIONS[precision])
            before = path.read_bytes() if path.exists() else b""
            again, second_s = _apply(workload, PRECISIONS[precision])
            reused = again == report and path.exists() and path.read_bytes() == before
            print(f"\n{workload}, {precision}: apply {first_s:.2f} s, again {second_s:.2f} s "
                  f"({'from the cache' if reused else 'NOT from the cache'})")
            for kernel, line in report.get("fused_kernels_measured", {}).items():
                swapped = report["fused_kernels"].get(kernel, 0)
                print(f"  {kernel:<15} {line}  [{swapped} swapped]")
            rows.append({"workload": workload, "precision": precision, "report": report,
                         "apply_s": first_s, "again_s": second_s, "reused": reused})
            if args.json:
                args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["reused"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

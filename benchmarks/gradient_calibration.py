"""Calibrate the gradient gate: the worst per-tensor cosine and norm ratio of clean
configurations against the fp32 reference, per workload and configuration.

The tolerances in tuner_tui/engine/gradients.py (GRADIENT_TOLERANCE) come from these figures.
Runs in one process (no worker), on the CPU (TRITON_INTERPRET=1 for the kernels) or a GPU:

    python benchmarks/gradient_calibration.py --device cpu --workloads gpt2-tiny,llama-tiny
    python benchmarks/gradient_calibration.py --device cuda --workloads gpt2-124m,llama-1b
"""

from __future__ import annotations

import argparse
import os
import time

KERNELS = ["layer_norm", "gelu", "rms_norm", "swiglu", "linear_cross_entropy"]
CONFIGS = [
    {}, {"attention": "sdpa"}, {"checkpointing": "full"}, {"fused_kernels": KERNELS},
    {"precision": "bf16"}, {"precision": "bf16", "attention": "sdpa"},
    {"precision": "bf16", "fused_kernels": KERNELS},
]
GPU_CONFIGS = [
    {"precision": "tf32", "attention": "sdpa"},
    {"precision": "bf16", "attention": "sdpa", "compile_mode": "default"},
    {"precision": "bf16", "attention": "sdpa", "compile_mode": "default", "fused_kernels": KERNELS},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="gpt2-tiny,llama-tiny")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from strategies.config import TuneConfig
    from tuner_tui.engine import workloads
    from tuner_tui.engine.gradients import GRADIENT_TOLERANCE
    from tuner_tui.engine.reference_gradients import reference_gradients
    from tuner_tui.engine.trial import Trainer

    configs = CONFIGS + (GPU_CONFIGS if args.device == "cuda" else [])
    print(f"tolerances: {GRADIENT_TOLERANCE}")
    for name in args.workloads.split(","):
        workload = workloads.load(name, None, 0, None, args.device)
        batch = workload.default_batch_size
        reference = reference_gradients(workload, batch, 0, args.device)
        for config in map(TuneConfig.from_dict, configs):
            start = time.time()
            trainer = Trainer(workload=workload, config=config, device=args.device, seed=0,
                              reference_gradients=reference)
            try:
                trainer.build()
                trainer.step()
                trainer.finish()
                c = trainer.gradient_check
                print(f"{name:28s} {config.label():58s} ok={c.ok} tensors={c.compared} "
                      f"1-cos={1 - c.min_cosine:.2e} |ratio-1|={abs(c.worst_norm_ratio - 1):.2e} "
                      f"worst={c.worst_tensor} ({time.time() - start:.1f} s)", flush=True)
            except Exception as exc:  # a configuration this machine cannot run
                print(f"{name:28s} {config.label():58s} {type(exc).__name__}: {exc}", flush=True)
            finally:
                trainer.close()


if __name__ == "__main__":
    main()

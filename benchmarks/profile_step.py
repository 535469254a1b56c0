"""Where a training step's GPU time goes: the top kernels of a few profiled steps.

    python3 benchmarks/profile_step.py --workload gpt2-124m --set precision=bf16 ...
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from strategies.config import TuneConfig, parse_assignments
from tuner_tui.engine import workloads
from tuner_tui.engine.trial import Trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="gpt2-124m")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    config = TuneConfig.from_dict(parse_assignments(args.set))
    trainer = Trainer(workloads.load(args.workload), config, "cuda", warmup_steps=5,
                      device_name=torch.cuda.get_device_name())
    trainer.build()
    for _ in range(8):
        trainer.step()
    trainer.finish()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            trainer.step()
        trainer.finish()
    print(config.label())
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()

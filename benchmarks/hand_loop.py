"""The same model and strategies in the plainest possible loop (pre-made batches, no per-step
bookkeeping, one synchronisation at the end), to measure what gputune's trainer adds.

    python3 benchmarks/hand_loop.py --set precision=bf16 --set attention=sdpa ...
"""

from __future__ import annotations

import argparse

import torch

import strategies
from strategies.config import TuneConfig, parse_assignments
from tuner_tui.engine import workloads


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="gpt2-124m")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    config = TuneConfig.from_dict(parse_assignments(args.set))
    w = workloads.load(args.workload)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    with dev:
        model = w.build_model()
    tuned = strategies.apply(config, model, w.make_optimizer(model), device_type="cuda")
    bs = config.batch_size or w.default_batch_size
    batches = [w.batch(i, bs, dev) for i in range(args.steps)]
    graphs = config.compile_mode == "reduce-overhead"

    def step(i):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with tuned.autocast():
            loss = w.loss(tuned.model, batches[i])
        tuned.step(loss)

    warm = 8
    for i in range(warm):
        step(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(warm, args.steps):
        step(i)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / (args.steps - warm)
    tokens = bs * w.items_per_sample
    print(f"hand loop  {config.label():70s} {ms:7.2f} ms/step  {tokens / ms * 1e3 / 1e3:7.1f}k tokens/s")


if __name__ == "__main__":
    main()

"""torchao's AdamW step, compiled before the trial that steps with it.

torchao's optimizers (bf16 weights; bf16 or 8-bit state) compile their per-parameter step the
first time they step: one graph per parameter shape, dtype and set of hyperparameters (9-43 s
for a transformer on the GPU hosts, 94 s for EfficientNet-B0's 76 shapes). The compiled graphs
land in the Inductor cache that every worker of a search shares, so a worker of its own can
compile them while the search's first trials run (`runner.OptimizerStepWarmup`), and the trial
that steps with torchao first reads them from the cache.

What is stepped here stands in for the trial's parameters: one tensor per distinct (group,
shape, dtype, stride) of the model's parameters as the trial will hold them (the weights cast
as `strategies.weights` casts them, on a copy of the model built on the meta device), in
groups with the workload's own hyperparameters, through the optimizer `strategies.optimizer`
builds. The compiled graphs are then the trial's own; the stand-ins take the memory of one
parameter of each shape, and are given back to the GPU after each pair: a trial beside this
worker may need all of it.
"""

from __future__ import annotations

import contextlib
import os
import time
from types import SimpleNamespace
from typing import Callable

import torch

from strategies import optimizer as optimizer_strategy
from strategies import weights as weights_strategy


def stand_in_optimizer(workload, device: str, weights: str) -> torch.optim.Optimizer:
    """The workload's own optimizer over one stand-in parameter per distinct (group, shape,
    dtype, stride), on `device`, the weights cast as `weights` casts them."""
    with torch.device("meta"):
        model = workload.build_model()
    weights_strategy.apply(SimpleNamespace(model=model, report={}),
                           SimpleNamespace(weights=weights))
    made = workload.make_optimizer(model)
    groups = []
    for group in made.param_groups:
        shapes = {}
        for p in group["params"]:
            shapes.setdefault((tuple(p.shape), p.dtype, p.stride()), p)
        stand_ins = [torch.zeros(p.shape, dtype=p.dtype, device=device).as_strided(
                         p.shape, p.stride()).requires_grad_(p.requires_grad)
                     for p in shapes.values()]
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": stand_ins})
    return type(made)(groups)


def compile_steps(workload, device: str, weights: str, state: str) -> tuple[float, str]:
    """(seconds, "") after one step of the optimizer a trial of `weights` and `state` steps
    with, over stand-ins of the workload's parameters; (seconds, why) where it failed."""
    started = time.perf_counter()
    try:
        user_optimizer = stand_in_optimizer(workload, device, weights)
        config = SimpleNamespace(weights=weights, optimizer_state=state, optimizer="plain")
        stepping, _ = optimizer_strategy.build(user_optimizer, config)
        for group in stepping.param_groups:
            for p in group["params"]:
                p.grad = torch.full_like(p, 1e-3)
        stepping.step()
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # a model that will not build on the meta device, a user's optimizer
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - started, ""


OOM_RETRY_S = 20.0
"""How long a pair that ran out of GPU memory waits for its one more try: the trial beside it
that filled the GPU (an fp32 baseline that itself runs out of memory) has ended by then."""


def compile_all(workload, device: str, variants, report: Callable[[str, str, float, str], None],
                retry_after_s: float = OOM_RETRY_S) -> None:
    """Each (weights, state) pair of `variants` compiled in turn (`compile_steps`), then
    `report(weights, state, seconds, error)`; a pair that ran out of memory is tried once
    more, `retry_after_s` after the others, before it is reported."""
    again = []
    for weights, state in variants:
        seconds, error = _compile_and_free(workload, device, weights, state)
        if "out of memory" in error.lower():
            again.append((weights, state))
            continue
        report(weights, state, seconds, error)
    for weights, state in again:
        time.sleep(retry_after_s)
        report(weights, state, *_compile_and_free(workload, device, weights, state))


def _compile_and_free(workload, device: str, weights: str, state: str) -> tuple[float, str]:
    done = compile_steps(workload, device, weights, state)
    if device == "cuda":  # the stand-ins are gone with compile_steps' frame: their memory too
        torch.cuda.empty_cache()
    return done


def lowest_priority() -> None:
    """This process at the lowest CPU priority, every thread of it: on Linux a nice value
    belongs to a thread, and `os.nice` leaves those made before it (torch's intra-op pool,
    CUDA's) at theirs. The threads and processes made after (the compile pool) inherit it."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # (no /proc: the calling thread, as os.nice does)
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
            os.setpriority(os.PRIO_PROCESS, tid, 19)

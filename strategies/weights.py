"""Weights: fp32 (master weights in fp32, autocast casts per op) or bf16 (the parameters, and so
their gradients, stored in bf16: half the memory of each, no fp32 copy anywhere).

bf16 keeps 8 bits of mantissa, so an update smaller than 1/256 of a weight rounds away under
round-to-nearest; the optimizer strategy therefore steps bf16 weights with torchao's AdamW and
stochastic rounding, which is unbiased on average. Only parameters are cast: buffers (rotary
frequencies, masks) keep their dtype, and autocast (precision = bf16, which a registry rule
requires) handles the mixed inputs. A normalization that keeps running statistics (BatchNorm,
InstanceNorm with tracked statistics) keeps its parameters too: its fused kernel takes the
weights and the statistics together in one dtype, and the statistics stay fp32 (a running
variance in bf16 would drift); the input may be bf16 beside them.
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def apply(run, config) -> None:
    if config.weights == "fp32":
        run.report["weights"] = {"dtype": "as built"}
        return
    dtype = DTYPES[config.weights]
    cast = 0
    kept = {id(p) for m in run.model.modules() if has_running_statistics(m)
            for p in m.parameters(recurse=False)}
    for param in run.model.parameters():
        if param.is_floating_point() and param.dtype != dtype and id(param) not in kept:
            # In place on the Parameter (not module.to()), so every reference to it (the
            # user's optimizer, tied weights, swapped modules) sees the same tensor.
            param.data = param.data.to(dtype)
            cast += 1
    run.report["weights"] = {"dtype": config.weights, "parameters_cast": cast,
                             "kept_beside_running_statistics": len(kept)}


def has_running_statistics(module: torch.nn.Module) -> bool:
    stats = getattr(module, "running_mean", None)
    return isinstance(stats, torch.Tensor) and stats.is_floating_point()

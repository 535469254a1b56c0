"""Gradient faults injected into gputune's own kernels, for the tests of the gradient gate.

`WorkerSpec.fault_injection = "grad:<kernel>:<fault>"` patches the backward of one kernel's eager
autograd Function inside the worker process (the path an eager fused-kernel run takes):

- `x2`: every gradient the kernel returns is doubled (a scale bug; AdamW hides it from the loss);
- `zero-weight`: the weight gradient of the first call is zeroed (one norm's weight, in the
  first backward pass, which runs the last block's norm first);
- `negate-weight`: the weight gradient of the first call has the wrong sign.

Kernels: layer_norm, rms_norm (weight gradient at index 1), linear_cross_entropy (index 1).
"""

from __future__ import annotations

import importlib

FUNCTIONS = {
    "layer_norm": ("gputune_kernels.layer_norm", "_LayerNormFunction"),
    "rms_norm": ("gputune_kernels.rms_norm", "_RMSNormFunction"),
    "linear_cross_entropy": ("gputune_kernels.fused_linear_cross_entropy", "_FusedLinearCrossEntropyFunction"),
}
FAULTS = ("x2", "zero-weight", "negate-weight")
WEIGHT_INDEX = 1


def install(spec: str) -> None:
    _, kernel, fault = (spec.split(":") + ["", ""])[:3]
    if kernel not in FUNCTIONS or fault not in FAULTS:
        raise ValueError(f"fault injection {spec!r}: expected grad:<{'|'.join(FUNCTIONS)}>:"
                         f"<{'|'.join(FAULTS)}>")
    module, name = FUNCTIONS[kernel]
    function = getattr(importlib.import_module(module), name)
    original = function.backward
    calls = [0]

    def backward(ctx, *grads):
        out = list(original(ctx, *grads))
        calls[0] += 1
        if fault == "x2":
            out = [g * 2 if g is not None else None for g in out]
        elif calls[0] == 1 and out[WEIGHT_INDEX] is not None:
            w = out[WEIGHT_INDEX]
            out[WEIGHT_INDEX] = w * 0 if fault == "zero-weight" else -w
        return tuple(out)

    function.backward = staticmethod(backward)

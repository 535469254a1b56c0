"""The package's public functions (`gputune_kernels` re-exports them): fused Triton kernels for
training, forward and backward, registered as torch custom ops.

Every function here is differentiable through autograd and is a ``torch.library.triton_op``
(namespace ``gputune``), so ``torch.compile(fullgraph=True)`` traces through it with no graph
break. Inputs are CUDA tensors, or CPU tensors when ``TRITON_INTERPRET=1`` is set (Triton's
interpreter; slow, for tests). Row-wise ops flatten all leading dims into rows over the last dim.
"""

from __future__ import annotations

import os

import torch

from gputune_kernels.causal_softmax import causal_softmax
from gputune_kernels.cross_entropy import cross_entropy
from gputune_kernels.fused_linear_cross_entropy import fused_linear_cross_entropy
from gputune_kernels.gelu import gelu_tanh
from gputune_kernels.layer_norm import layer_norm
from gputune_kernels.rms_norm import rms_norm
from gputune_kernels.softmax import softmax
from gputune_kernels.swiglu import swiglu

#: The public kernel functions, by name.
KERNEL_NAMES = (
    "softmax",
    "causal_softmax",
    "layer_norm",
    "rms_norm",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "swiglu",
    "gelu_tanh",
)


def available() -> tuple[bool, str]:
    """(True, how) when the Triton kernels can run here, else (False, why not)."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # pragma: no cover - triton ships with torch on Linux
        return False, f"Triton is not importable: {exc}"
    if torch.cuda.is_available():
        return True, f"CUDA device: {torch.cuda.get_device_name(0)}"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True, "TRITON_INTERPRET=1: kernels run on the CPU through Triton's interpreter (slow)"
    return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on the CPU, slowly)"


__all__ = ["KERNEL_NAMES", "available", *KERNEL_NAMES]

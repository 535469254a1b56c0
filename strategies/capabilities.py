"""What the machine a run goes to can do (`Capabilities`), and why an option's value cannot run
there. Plain data, no torch: the UI holds it and the CLI words its messages from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strategies.options import Option


@dataclass(frozen=True)
class Capabilities:
    """What the machine a run goes to can do; plain data so the UI can hold it."""

    device: str  # "cuda" or "cpu"
    cuda: bool
    bf16: bool
    triton: bool
    gpu_name: str = ""
    fp8: bool = False
    """float8 matmuls: a CUDA GPU of compute capability 8.9 or newer."""
    reasons: dict = field(default_factory=dict)
    """Why a capability is missing, e.g. {"cuda": "no CUDA device (NVML: library not found)"}."""

    def has(self, need: str) -> bool:
        return bool(getattr(self, need))

    def why_not(self, need: str) -> str:
        return self.reasons.get(need) or f"needs {need}"

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "cuda": self.cuda,
            "bf16": self.bf16,
            "triton": self.triton,
            "gpu_name": self.gpu_name,
            "fp8": self.fp8,
            "reasons": dict(self.reasons),
        }


CAPABILITY_WORDS = {
    "cuda": "a CUDA GPU",
    "bf16": "bfloat16 support (a CUDA GPU of compute capability 8.0+, or the CPU)",
    "triton": "Triton kernels (a CUDA GPU with triton installed)",
    "fp8": "float8 matmuls (a CUDA GPU of compute capability 8.9+: Ada, Hopper or newer)",
}


def option_unavailable(option: Option, value: Any, caps: Capabilities) -> str | None:
    """Why `option = value` cannot run with `caps`, or None if it can."""
    for need in option.needs(value):
        if not caps.has(need):
            return (
                f"{option.key} = {option.show(value)} needs {CAPABILITY_WORDS.get(need, need)}, "
                f"and device = {caps.device} has none: {caps.why_not(need)}"
            )
    return None

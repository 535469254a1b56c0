"""Peak FLOP rates for MFU: a datasheet table of dense (no sparsity) rates for common NVIDIA
GPUs, per precision; an unknown device gets a short matmul probe. Each peak says where it came
from, and the UI shows it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# TFLOP/s, dense, by precision: fp32 (plain FMA), tf32, bf16, fp16, fp8 tensor cores (fp8: for
# the profile's fp8 matmuls). Matched by substring of the device name, first match wins (so
# longer names come first).
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "tf32": 8.1, "fp16": 65.0}),
)

_PROBE_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    tflops: float
    source: str
    """e.g. "datasheet: NVIDIA H200 bf16 dense" or "probe: 2048^3 fp32 matmul on cpu"."""


def _probe(precision: str, device: str) -> Peak:
    n = 4096 if device == "cuda" else 1024
    dtype = _PROBE_DTYPE[precision]
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        for _ in range(3):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        # The fastest of several timings: a peak is what the device can do, and other load
        # on the machine only ever slows a timing down.
        seconds = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(4):
                a @ b
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = min(seconds, (time.perf_counter() - start) / 4)
    finally:
        torch.set_float32_matmul_precision(old)
    return Peak(2 * n**3 / seconds / 1e12, f"probe: {n}^3 {precision} matmul on {device}")


def peak_for(device: str, device_name: str, precision: str) -> Peak:
    if device == "cuda":
        for key, table in PEAK_TFLOPS:
            if key in device_name and precision in table:
                return Peak(table[precision], f"datasheet: {device_name} {precision} dense")
    return _probe(precision, device)

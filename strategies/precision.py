"""Precision: fp32, tf32 (tensor-core matmuls for fp32 tensors), bf16 or fp16 autocast.

Weights stay fp32 (autocast casts per op), so the optimizer state and the exported model are
unchanged. fp16's narrow range needs loss scaling: a GradScaler, unscaled before clipping.
"""

from __future__ import annotations

import torch

from strategies.config import ConfigError

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def apply(run, config) -> None:
    # Set explicitly every time: a long-lived worker switches between configurations, and
    # this is process-wide state.
    high = config.precision != "fp32"
    torch.set_float32_matmul_precision("high" if high else "highest")
    torch.backends.cudnn.allow_tf32 = high
    if config.precision == "fp16" and run.device_type != "cuda":
        raise ConfigError("precision = fp16 needs a CUDA GPU (GradScaler); device = cpu")
    run.autocast_dtype = AUTOCAST_DTYPES.get(config.precision)
    run.scaler = torch.amp.GradScaler(run.device_type) if config.precision == "fp16" else None
    run.report["precision"] = {
        "autocast": str(run.autocast_dtype).replace("torch.", "") if run.autocast_dtype else None,
        "matmul": "tf32" if high else "fp32",
        "grad_scaler": run.scaler is not None,
    }

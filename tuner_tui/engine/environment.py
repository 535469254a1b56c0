"""What machine a measurement was taken on: the fingerprint stored with every result, and the
capabilities the configuration is checked against."""

from __future__ import annotations

import importlib.util
import os
import platform
import socket

import torch

from strategies.registry import Capabilities
from tuner_tui import __version__
from strategies.code_version import code_hash
from strategies.versions import driver_version, triton_version


def cpu_model() -> str:
    """The processor's marketing name where the OS tells it (platform.processor() is often only
    the architecture on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def fingerprint(device: str) -> dict:
    env = {
        "device": device,
        "gpu_name": None,
        "gpu_count": 0,
        "gpu_memory_bytes": None,
        "compute_capability": None,
        "driver": driver_version(),
        "cuda": str(torch.version.cuda) if torch.version.cuda else None,
        "torch": str(torch.__version__),  # a TorchVersion would import torch where unpickled
        "triton": triton_version(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "gputune": __version__,
        "code": code_hash(),
        "cpu_count": os.cpu_count(),
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
    return env


def capabilities(device: str) -> Capabilities:
    reasons = {}
    cuda = device == "cuda" and torch.cuda.is_available()
    if not cuda:
        reasons["cuda"] = (
            "device = cpu was chosen" if device == "cpu" else "torch sees no CUDA device"
        )
    if cuda:
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        if not bf16:
            reasons["bf16"] = "this GPU has no native bfloat16 (compute capability < 8.0)"
    else:
        bf16 = True  # CPU autocast supports bfloat16
    has_triton = importlib.util.find_spec("triton") is not None
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    triton_ok = has_triton and (cuda or interpret)
    if not has_triton:
        reasons["triton"] = "triton is not installed"
    elif not triton_ok:
        reasons["triton"] = "Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for tests)"
    name = torch.cuda.get_device_properties(0).name if cuda else ""
    fp8 = cuda and torch.cuda.get_device_capability(0) >= (8, 9)
    if not cuda:
        reasons["fp8"] = reasons["cuda"]
    elif not fp8:
        major, minor = torch.cuda.get_device_capability(0)
        reasons["fp8"] = f"{name} has compute capability {major}.{minor}; float8 needs 8.9+"
    return Capabilities(
        device="cuda" if cuda else "cpu", cuda=cuda, bf16=bf16, triton=triton_ok,
        gpu_name=name, fp8=fp8, reasons=reasons,
    )

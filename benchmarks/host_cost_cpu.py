"""The host's own cost of the kernels' eager calls, on a machine without a GPU.

Where a kernel's GPU work is shorter than the host's work for the call, the call runs at the
host's speed (docs/kernels.md, "Host overhead"). This script measures the part of that host
work that is ours and torch's, without a GPU: each op's fwd+bwd through the Python API and
autograd, at a tiny size (8 x 256, fp32), with the direct launch path of kernels/_launch.py
taken as on a GPU, except that the compiled Triton kernel it would call is replaced by a no-op.
So the figures leave out Triton's own launcher and the driver, and count everything else: our
checks and allocations, the launch path's key, autograd. The autograd engine's cost for a
Function that does nothing is the floor. Microseconds per call, the best of 5 repeats.

    python benchmarks/host_cost_cpu.py [--calls 3000] [--json OUT.json]

The replacement is this script's alone: it patches the launcher in its own process, for this
measurement, and nothing else reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels load on the CPU

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputune_kernels  # noqa: E402
from gputune_kernels import _common, _launch  # noqa: E402
from kernels_bench import NoOpFunction  # noqa: E402  (beside this script)


def _take_the_gpu_path() -> None:
    """Every launcher takes the direct path as on a GPU, with a no-op for the kernel."""
    real_of = _launch.of

    def of(kernel):
        launcher = real_of(kernel)
        if not isinstance(launcher.kernel, _NoKernel):
            launcher.names = tuple(launcher.kernel.arg_names)
            launcher.passed = (True,) * len(launcher.names)
            if "all_passed" in _launch.Launcher.__slots__:
                launcher.all_passed = True
            launcher.kernel = _NoKernel()
        return launcher

    _launch.of = of
    _launch._cuda_device = lambda first: 0
    if hasattr(_launch, "_stream"):
        _launch._stream = lambda device: 0
    _common.tracing_interpreted = lambda t: False
    _common.check_device = lambda op, name, t: None  # on a GPU: `t.is_cuda`, and return


class _NoKernel:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: _NoRunner()


class _NoRunner:
    def __getitem__(self, grid):
        return lambda *params, stream=None: None


def _per_call_us(fn, calls: int) -> float:
    for _ in range(min(200, calls)):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def measure(calls: int) -> dict:
    _take_the_gpu_path()
    x = torch.randn(8, 256, requires_grad=True)
    w = torch.randn(256, requires_grad=True)
    b = torch.randn(256, requires_grad=True)
    g = torch.randn(8, 256)
    b2 = b.detach().expand(8, 256)
    grad = torch.autograd.grad
    return {
        "autograd, a Function doing nothing": _per_call_us(lambda: grad(NoOpFunction.apply(x), [x], g), calls),
        "rms_norm": _per_call_us(lambda: grad(gputune_kernels.rms_norm(x, w), [x, w], g), calls),
        "layer_norm": _per_call_us(lambda: grad(gputune_kernels.layer_norm(x, w, b), [x, w, b], g), calls),
        "gelu_tanh": _per_call_us(lambda: grad(gputune_kernels.gelu_tanh(x), [x], g), calls),
        "swiglu": _per_call_us(lambda: grad(gputune_kernels.swiglu(x, b2), [x], g), calls),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000, help="calls per repeat (at least 1)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error(f"--calls {args.calls} is out of range: at least 1")
    us = measure(args.calls)
    for name, value in us.items():
        print(f"{name:36s} {value:7.1f} us")
    if args.json:
        doc = {"host_us_per_fwd_bwd": us, "calls": args.calls, "cpu": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

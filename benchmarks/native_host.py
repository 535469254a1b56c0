"""The host's time per call of LayerNorm, RMSNorm and GELU fwd+bwd: torch eager, our C++ node
and our Python Function, at a tiny size and at training sizes (CUDA only).

kernels_bench.py times each call on the GPU (events around it, the L2 flushed before it),
which reads the host's time only where the host is slower than the GPU. This times the host
directly: the wall time of `calls` calls queued back to back (one synchronization at the end),
divided by `calls`, in interleaved rounds; beside it the GPU time of one call by graph replay.
Where the host's time per call is above the GPU's, the call is host-bound.

    python benchmarks/native_host.py --json out.json [--rounds 5] [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pythonpath"))  # kernels/ as gputune_kernels
import gputune_kernels  # noqa: E402
from gputune_kernels import _native  # noqa: E402


def _wall_us(step, calls: int) -> float:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _python(fn):
    def run():
        _native.set_enabled(False)
        try:
            return fn()
        finally:
            _native.set_enabled(True)
    return run


def cases(rows: int, cols: int) -> dict:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    ln = lambda: torch.autograd.grad(gputune_kernels.layer_norm(x, w, b), [x, w, b], g)  # noqa: E731
    rms = lambda: torch.autograd.grad(gputune_kernels.rms_norm(x, w), [x, w], g)  # noqa: E731
    gelu = lambda: torch.autograd.grad(gputune_kernels.gelu_tanh(x), [x], g)  # noqa: E731
    ln()  # the first call registers the node's kernels and stream with the C++ entry
    ext = _native.extension()

    return {
        "LayerNorm eager": lambda: torch.autograd.grad(F.layer_norm(x, (cols,), w, b), [x, w, b], g),
        "LayerNorm node": ln,
        "LayerNorm node, C++ entry called directly": lambda: torch.autograd.grad(
            ext.layer_norm(x, w, b, 1e-5), [x, w, b], g),
        "LayerNorm node, forward only": lambda: gputune_kernels.layer_norm(x, w, b),
        "LayerNorm eager, forward only": lambda: F.layer_norm(x, (cols,), w, b),
        "LayerNorm Python Function": _python(ln),
        "RMSNorm node": rms,
        "RMSNorm Python Function": _python(rms),
        "GELU eager": lambda: torch.autograd.grad(F.gelu(x, approximate="tanh"), [x], g),
        "GELU node": gelu,
        "GELU node, forward only": lambda: gputune_kernels.gelu_tanh(x),
        "GELU eager, forward only": lambda: F.gelu(x, approximate="tanh"),
        "GELU Python Function": _python(gelu),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("native_host: needs a CUDA device", file=sys.stderr)
        return 2
    status = _native.wait(timeout=600)
    print(f"C++ autograd nodes: {status}")
    if status != "ready":
        return 1
    from triton.testing import do_bench_cudagraph

    from kernels_bench import environment  # gpu, driver, torch, triton, date

    report = {**environment(), "native": status, "shapes": {}}
    for rows, cols in ((8, 256), (8192, 2048), (16384, 768), (8192, 4096)):
        parts = cases(rows, cols)
        names = list(parts)
        wall = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                wall[n].append(_wall_us(parts[n], args.calls))
        gpu = {}
        for n in names:
            try:
                gpu[n] = do_bench_cudagraph(parts[n], rep=50, return_mode="median") * 1e3
            except Exception as exc:  # noqa: BLE001 - one capture failing loses only its figure
                gpu[n] = repr(exc)[:100]
        key = f"{rows}x{cols}"
        report["shapes"][key] = {"host_us": wall, "gpu_us": gpu}
        print(f"{key}: host us per call, median (min-max) of {args.rounds} rounds; GPU us by graph replay")
        for n in names:
            v = sorted(wall[n])
            g = gpu.get(n)
            print(f"  {n:40s} {v[len(v) // 2]:7.1f} ({v[0]:.1f}-{v[-1]:.1f})"
                  + (f"   gpu {g:6.1f}" if isinstance(g, float) else ""))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

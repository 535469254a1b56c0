"""The kernel benchmark's host-time breakdown runs (its figures come from the GPU; here, under
Triton's interpreter, only that every part runs and is timed)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_bench.py"


@pytest.fixture(scope="module")
def kernels_bench():
    spec = importlib.util.spec_from_file_location("kernels_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_host_breakdown_times_every_part(kernels_bench):
    from gputune_kernels import _launch, _native, _partial_sums

    parts = kernels_bench.host_breakdown(device="cpu", calls=1, rounds=2)
    assert set(parts) == {
        "three launches", "three launches, Triton's usual launch", "one launch: the partial sums",
        "one torch op: add_", "the partial sums in torch, into bf16 (sum, copy)",
        "fwd + bwd implementations, no autograd", "through the API and autograd",
        "the API, Python Function", "the API, Python Function, Triton's usual launch",
        "the API, Python Function, partial sums in torch",
        "LayerNorm: fwd + bwd implementations, no autograd", "LayerNorm: through the API and autograd",
        "LayerNorm: the API, Python Function", "LayerNorm: the API, Python Function, Triton's usual launch",
        "LayerNorm: the API, Python Function, partial sums in torch",
        "GELU: through the API and autograd", "GELU: the API, Python Function",
        "GELU: the API, Python Function, Triton's usual launch",
        "eager torch: F.layer_norm", "eager torch: F.gelu tanh",
        "autograd, a Function doing nothing", "empty_like x4",
    }
    assert all(len(us) == 2 and min(us) > 0 for us in parts.values()), parts
    # the A/B parts put the defaults back
    assert _launch._ENABLED and _partial_sums.MODE == "kernel" and _native.ENABLED


def test_median(kernels_bench):
    assert kernels_bench._median([3.0, 1.0, 2.0]) == 2.0
    assert kernels_bench._median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_the_cpu_host_cost_script_runs_and_writes_its_figures(tmp_path):
    import json
    import subprocess

    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "host_cost_cpu.py"), "--calls", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())["host_us_per_fwd_bwd"]
    assert set(figures) == {"autograd, a Function doing nothing", "rms_norm", "layer_norm", "gelu_tanh", "swiglu"}
    assert all(us > 0 for us in figures.values())

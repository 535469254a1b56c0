"""Benchmark gputune's Triton kernels against torch eager and torch.compile, in one run.

    python benchmarks/kernels_bench.py --json benchmarks/results/kernels-h200.json

For every op at the shapes of ANCHORS.md: check ours against a float32 torch reference first
(relative error of the output and of every gradient), then time ours, torch eager and
torch.compile of the eager code with triton.testing.do_bench (median), and measure the peak
memory one call allocates above what was allocated before it. The device copy bandwidth is
measured in the same run. Needs CUDA. Writes the JSON after every case, prints a table last.

Each timing is of one forward+backward called from Python, without synchronizing, so where the
host work per call (Python, launches) takes longer than the GPU work it is the host's time that
is measured; "graph" (CUDA-graph replay) is the GPU's time alone. LayerNorm, RMSNorm and GELU
are measured at the issue's shapes and at GPT-2's and Llama's. linear+CE's variants are chunk
sizes, and "budget=1.1GiB": the most rows per chunk whose working set
(kernels/fused_linear_cross_entropy.py, working_set_bytes) fits 1.1 GiB.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputune_kernels  # noqa: E402

GiB = 1024**3
MiB = 1024**2


@dataclass
class Case:
    """One op at one shape. `make` builds the inputs; impls map a name to a function of them."""

    name: str
    make: Callable[[], dict]
    eager: Callable[..., torch.Tensor]
    ours: Callable[..., torch.Tensor]
    grad_inputs: tuple[str, ...] = ()  # empty: forward only
    bytes_moved: float = 0.0  # fewest bytes one call must move (for GB/s)
    flops: float = 0.0  # for TFLOP/s
    variants: dict = field(default_factory=dict)  # extra "ours" settings, timed alongside
    anchors: dict = field(default_factory=dict)  # other projects' implementations, timed alongside
    tol: float = 2e-2  # relative error allowed against the float32 reference
    graphed: bool = False  # also time CUDA-graph replays (no CPU launch overhead)
    target: str = ""  # the target, for the table


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _step(fn, inputs, grad_inputs, grad_out):
    leaves = [inputs[k] for k in grad_inputs]

    def step():
        out = fn(**inputs)
        if leaves:
            torch.autograd.grad(out, leaves, grad_out)
        return out

    return step


def _peak_extra(step) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MiB


def _outputs_and_grads(fn, inputs, grad_inputs, grad_out):
    out = fn(**inputs)
    grads = torch.autograd.grad(out, [inputs[k] for k in grad_inputs], grad_out) if grad_inputs else ()
    return [out.detach(), *[g.detach() for g in grads]]


def check(case: Case, inputs: dict, grad_out) -> dict:
    """Relative error of ours (output, then each grad) against eager on float32 copies."""
    ref_inputs = {
        k: (v.detach().float().requires_grad_(v.requires_grad) if torch.is_tensor(v) and v.is_floating_point() else v)
        for k, v in inputs.items()
    }
    ref_grad_out = grad_out.float() if torch.is_tensor(grad_out) else grad_out
    ref = _outputs_and_grads(case.eager, ref_inputs, case.grad_inputs, ref_grad_out)
    got = _outputs_and_grads(case.ours, inputs, case.grad_inputs, grad_out)
    names = ["out", *[f"d{k}" for k in case.grad_inputs]]
    errs = {n: _rel_err(g, r) for n, g, r in zip(names, got, ref)}
    del ref, got, ref_inputs
    torch.cuda.empty_cache()
    return {"rel_err": errs, "correct": all(e <= case.tol for e in errs.values())}


def time_impl(fn, inputs, case: Case, grad_out, rep_ms: float) -> dict:
    from triton.testing import do_bench

    step = _step(fn, inputs, case.grad_inputs, grad_out)
    step()  # compile / warm up outside the timing
    ms = do_bench(step, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median")
    res = {"ms": ms, "peak_extra_mib": _peak_extra(step)}
    if case.graphed:
        from triton.testing import do_bench_cudagraph

        try:
            res["ms_graph"] = do_bench_cudagraph(step, rep=rep_ms, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a capture failure loses only this number
            res["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
    if case.bytes_moved:
        res["GB/s"] = case.bytes_moved / (ms * 1e-3) / 1e9
    if case.flops:
        res["TFLOP/s"] = case.flops / (ms * 1e-3) / 1e12
    torch.cuda.empty_cache()
    return res


def copy_bandwidth() -> dict:
    from triton.testing import do_bench

    src = torch.randn(GiB // 4, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    gbs = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * GiB, "ms": ms, "GB/s": gbs}


# ---- the cases ---------------------------------------------------------------------------

def _randn(*shape, dtype, grad=False, scale=1.0):
    t = (torch.randn(*shape, device="cuda") * scale).to(dtype)
    return t.requires_grad_(grad)


def _rms_norm_eager(x, w, eps=1e-6):
    # As Llama's RMSNorm: statistics in fp32, the product back in the input dtype.
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _softmax_warps(w):
    sm = sys.modules["gputune_kernels.softmax"]

    def run(x):
        y = torch.empty_like(x)
        n = x.shape[-1]
        sm._softmax_fwd_kernel[(x.shape[0],)](
            x, y, x.shape[0], n, 1, 1.0, CAUSAL=False, SINGLE=True, ROWS=1, BLOCK=triton_next_pow2(n), num_warps=w
        )
        return y

    return run


def triton_next_pow2(n):
    import triton

    return triton.next_power_of_2(n)


# The kernels' module settings a variant may change; run_case puts each back after every
# timed impl.
_SETTINGS = (
    ("gputune_kernels._partial_sums", "MODE"),  # how the norms add their partial sums
    ("gputune_kernels._launch", "_ENABLED"),  # our direct launch (else Triton's own)
    ("gputune_kernels._native", "ENABLED"),  # the C++ autograd nodes (else the Python Function)
)
_PYTHON = ("gputune_kernels._native", "ENABLED", False)


def _setting_variant(ours, *settings):
    """ours with some of _SETTINGS set, each given as (module, attribute, value): the Python
    Function instead of the C++ node, the norms' partial sums in torch, every launch through
    Triton's own launch."""
    def run(*args, **kwargs):
        # set on every call: the backward, which runs after this returns, reads them too
        for module, attribute, value in settings:
            setattr(importlib.import_module(module), attribute, value)
        return ours(*args, **kwargs)

    return run


def _python_variants(ours, norm: bool) -> dict:
    """The Python paths beside the default (the C++ node where it is built): the Python
    Function with our launch, with Triton's launch, and for the norms with torch's partial sums
    (which the node does not do)."""
    variants = {
        "python": _setting_variant(ours, _PYTHON),
        "python, launch=triton": _setting_variant(ours, _PYTHON, ("gputune_kernels._launch", "_ENABLED", False)),
    }
    if norm:
        variants["python, partial sums=torch"] = _setting_variant(
            ours, _PYTHON, ("gputune_kernels._partial_sums", "MODE", "torch"))
    return variants


def _flce_variant(chunk_rows):
    def run(hidden, weight, target):
        return gputune_kernels.fused_linear_cross_entropy(hidden, weight, target, chunk_rows=chunk_rows)

    return run


def _flce_budget_variant(budget_bytes):
    from gputune_kernels.fused_linear_cross_entropy import chunk_rows_for_budget

    def run(hidden, weight, target):
        rows = chunk_rows_for_budget(hidden.shape[0], hidden.shape[1], weight.shape[0], weight.element_size(),
                                     budget_bytes)
        return gputune_kernels.fused_linear_cross_entropy(hidden, weight, target, chunk_rows=rows)

    return run


class _MatmulsOnly(torch.autograd.Function):
    """The floor of a three-matmul linear + cross-entropy at a chunk size: the same matmuls per
    chunk (logits, grad_hidden, grad_weight accumulated), with the logits standing in for their
    gradient and no cross-entropy pass. What ours costs beyond it is the cross-entropy."""

    @staticmethod
    def forward(ctx, hidden, weight, chunk_rows):
        grad_h, grad_w = torch.empty_like(hidden), None
        for start in range(0, hidden.shape[0], chunk_rows):
            h = hidden[start:start + chunk_rows]
            logits = torch.mm(h, weight.t())
            torch.mm(logits, weight, out=grad_h[start:start + chunk_rows])
            if grad_w is None:
                grad_w = torch.mm(logits.t(), h)
            else:
                grad_w.addmm_(logits.t(), h)
        ctx.save_for_backward(grad_h, grad_w)
        return hidden.new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, _grad):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h, grad_w, None


def _matmuls_only_variant(chunk_rows):
    def run(hidden, weight, target):
        return _MatmulsOnly.apply(hidden, weight, chunk_rows)

    return run


def _ce_eager(logits, target):
    # The usual training code: upcast the logits, then torch's cross-entropy.
    return F.cross_entropy(logits.float(), target)


def _flce_eager(hidden, weight, target):
    return F.cross_entropy(F.linear(hidden, weight).float(), target)


def _liger(op: str) -> dict:
    """Liger-Kernel's implementation of the op as an anchor ({"liger": fn}), where its wheel is
    installed (the GPU runs carry it for the benchmark only; gputune does not use it)."""
    try:
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return {"liger": lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5)}
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            # Llama's casting, and not in place: the benchmark reuses its output gradient
            return {"liger": lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)}
        if op == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return {"liger": lambda a, b: LigerSiLUMulFunction.apply(a, b)}
    except ImportError:
        pass
    return {}


def build_cases() -> list[Case]:
    cases = []
    for rows, cols in [(16384, 1024), (8192, 4096), (4096, 16384)]:
        variants = {f"warps={w}": _softmax_warps(w) for w in (4, 8, 16)} if cols == 4096 else {}
        cases.append(Case(
            name=f"softmax fwd {rows}x{cols} fp32",
            make=lambda r=rows, c=cols: {"x": _randn(r, c, dtype=torch.float32, scale=3)},
            eager=lambda x: torch.softmax(x, -1), ours=lambda x: gputune_kernels.softmax(x),
            bytes_moved=2 * rows * cols * 4, variants=variants, tol=1e-5,
            target=">= 0.9 x copy bandwidth" if cols == 4096 else "",
        ))
    cases.append(Case(
        name="softmax fwd+bwd 8192x4096 fp32",
        make=lambda: {"x": _randn(8192, 4096, dtype=torch.float32, grad=True, scale=3)},
        eager=lambda x: torch.softmax(x, -1), ours=lambda x: gputune_kernels.softmax(x), grad_inputs=("x",),
        bytes_moved=5 * 8192 * 4096 * 4, tol=1e-5,
    ))
    cases.append(Case(
        name="causal softmax fwd+bwd 16x12x1024x1024 bf16",
        make=lambda: {"s": _randn(16, 12, 1024, 1024, dtype=torch.bfloat16, grad=True, scale=4)},
        eager=lambda s: torch.softmax(
            (s * 0.125).masked_fill(torch.ones(1024, 1024, dtype=torch.bool, device=s.device).triu(1), float("-inf")),
            -1,
        ),
        ours=lambda s: gputune_kernels.causal_softmax(s, 0.125), grad_inputs=("s",),
        bytes_moved=5 * 16 * 12 * 1024 * 1024 * 2,
    ))
    # The shapes first, then GPT-2 124M's (16384 x 768) and a Llama's (8192 x 2048).
    for n, h in ((8192, 4096), (16384, 768), (8192, 2048)):
        cases.append(Case(
            name=f"RMSNorm fwd+bwd {n}x{h} bf16",
            make=lambda n=n, h=h: {
                "x": _randn(n, h, dtype=torch.bfloat16, grad=True), "w": _randn(h, dtype=torch.bfloat16, grad=True),
            },
            eager=_rms_norm_eager, ours=lambda x, w: gputune_kernels.rms_norm(x, w), grad_inputs=("x", "w"),
            bytes_moved=5 * n * h * 2, target="<= 1.5 x its graph time" if h == 4096 else "",
            variants=_python_variants(lambda x, w: gputune_kernels.rms_norm(x, w), norm=True),
            anchors=_liger("rms_norm"),
        ))
        cases.append(Case(
            name=f"LayerNorm fwd+bwd {n}x{h} bf16",
            make=lambda n=n, h=h: {
                "x": _randn(n, h, dtype=torch.bfloat16, grad=True), "w": _randn(h, dtype=torch.bfloat16, grad=True),
                "b": _randn(h, dtype=torch.bfloat16, grad=True),
            },
            eager=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
            ours=lambda x, w, b: gputune_kernels.layer_norm(x, w, b), grad_inputs=("x", "w", "b"),
            bytes_moved=5 * n * h * 2, target="<= torch eager",
            variants=_python_variants(lambda x, w, b: gputune_kernels.layer_norm(x, w, b), norm=True),
            anchors=_liger("layer_norm"),
        ))
    for vocab in (50304, 128256):
        cases.append(Case(
            name=f"cross-entropy fwd+bwd 8192x{vocab} bf16",
            make=lambda v=vocab: {
                "logits": _randn(8192, v, dtype=torch.bfloat16, grad=True, scale=3),
                "target": torch.randint(0, v, (8192,), device="cuda"),
            },
            eager=_ce_eager, ours=lambda logits, target: gputune_kernels.cross_entropy(logits, target),
            grad_inputs=("logits",), bytes_moved=3 * 8192 * vocab * 2,
            target="<= 2.5 ms, no extra full-size buffer" if vocab == 128256 else "",
        ))
    # The shapes (hidden 4096), and llama-1b's LM head (hidden 2048), where the chunk
    # size decides whether kernels + compile keep up with compile alone (docs/kernels.md).
    for hidden_size, vocab in ((4096, 50304), (4096, 128256), (2048, 128256)):
        cases.append(Case(
            name=f"linear+CE fwd+bwd 8192x{hidden_size}->{vocab} bf16",
            make=lambda v=vocab, h=hidden_size: {
                "hidden": _randn(8192, h, dtype=torch.bfloat16, grad=True),
                "weight": _randn(v, h, dtype=torch.bfloat16, grad=True, scale=1 / 64),
                "target": torch.randint(0, v, (8192,), device="cuda"),
            },
            eager=_flce_eager,
            ours=lambda hidden, weight, target: gputune_kernels.fused_linear_cross_entropy(hidden, weight, target),
            grad_inputs=("hidden", "weight"), flops=3 * 2 * 8192 * hidden_size * vocab,
            variants={
                **{f"chunk_rows={c}": _flce_variant(c) for c in (256, 512, 1024, 2048, 4096)},
                "budget=1.1GiB": _flce_budget_variant(int(1.1 * GiB)),
                # the matmuls alone: the floor of this scheme at the default chunk and one chunk
                **{f"matmuls only, chunk_rows={c}": _matmuls_only_variant(c) for c in (4096, 8192)},
            },
            target="<= 36 ms, <= 1.1 GiB" if (hidden_size, vocab) == (4096, 128256) else "",
        ))
    cases.append(Case(
        name="SwiGLU fwd+bwd 8192x11008 bf16",
        make=lambda: {"a": _randn(8192, 11008, dtype=torch.bfloat16, grad=True, scale=2),
                      "b": _randn(8192, 11008, dtype=torch.bfloat16, grad=True)},
        eager=lambda a, b: F.silu(a) * b, ours=lambda a, b: gputune_kernels.swiglu(a, b), grad_inputs=("a", "b"),
        bytes_moved=8 * 8192 * 11008 * 2, target="<= 0.45 ms",
        variants=_python_variants(lambda a, b: gputune_kernels.swiglu(a, b), norm=False),
        anchors=_liger("swiglu"),
    ))
    for n, h in ((8192, 11008), (16384, 3072), (8192, 2048)):  # the issue's, GPT-2's MLP, a Llama's
        cases.append(Case(
            name=f"GELU-tanh fwd+bwd {n}x{h} bf16",
            make=lambda n=n, h=h: {"x": _randn(n, h, dtype=torch.bfloat16, grad=True, scale=2)},
            eager=lambda x: F.gelu(x, approximate="tanh"), ours=lambda x: gputune_kernels.gelu_tanh(x),
            grad_inputs=("x",), bytes_moved=5 * n * h * 2, target="<= torch eager",
            variants=_python_variants(lambda x: gputune_kernels.gelu_tanh(x), norm=False),
        ))
    for c in cases:
        c.graphed = not c.name.startswith("linear+CE")
    # The cases with targets first, so a run cut short by --budget-s loses the others.
    cases.sort(key=lambda c: c.name.startswith(("causal", "GELU")))
    return cases


def run_case(case: Case, rep_ms: float, with_compile: bool, rounds: int = 1) -> dict:
    torch.manual_seed(0)
    inputs = case.make()
    torch.cuda.synchronize()
    probe = case.eager(**inputs)
    grad_out = torch.randn_like(probe) if case.grad_inputs else None
    del probe
    torch.cuda.empty_cache()
    result = {"name": case.name, "target": case.target}
    result.update(check(case, inputs, grad_out))
    impls = {"ours": case.ours, "eager": case.eager}
    if with_compile:
        impls["compile"] = torch.compile(case.eager)
        # Ours inside a compiled graph: inductor calls the kernels from its generated code.
        impls["ours+compile"] = torch.compile(case.ours)
    impls.update({f"ours[{k}]": v for k, v in case.variants.items()})
    impls.update({f"anchor[{k}]": v for k, v in case.anchors.items()})
    defaults = [(importlib.import_module(m), a) for m, a in _SETTINGS]
    defaults = [(module, a, getattr(module, a)) for module, a in defaults]
    for label, fn in impls.items():
        t0 = time.perf_counter()
        try:
            result[label] = time_impl(fn, inputs, case, grad_out, rep_ms)
        except Exception as exc:  # one failing baseline must not lose the others
            result[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            for module, attribute, value in defaults:  # a variant may have changed it
                setattr(module, attribute, value)
        result[label]["wall_s"] = round(time.perf_counter() - t0, 1)
    if rounds > 1:
        _more_rounds(result, impls, inputs, case, grad_out, rep_ms, rounds - 1, defaults)
    del inputs, grad_out
    torch.cuda.empty_cache()
    return result


def _more_rounds(result, impls, inputs, case, grad_out, rep_ms, rounds, defaults) -> None:
    """Time every impl that ran `rounds` more times, interleaved (each round starts one impl
    later), so that a drift of the host's speed, which moves host-bound calls by tens of
    percent between device calls, falls on all of them alike. Each impl's "ms" becomes the
    median over all its rounds, with the rounds kept ("ms_rounds") for the spread."""
    from triton.testing import do_bench

    labels = [k for k in impls if "error" not in result[k]]
    steps = {k: _step(impls[k], inputs, case.grad_inputs, grad_out) for k in labels}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            try:
                ms = do_bench(steps[label], warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median")
            finally:
                for module, attribute, value in defaults:
                    setattr(module, attribute, value)
            result[label].setdefault("ms_rounds", [result[label]["ms"]]).append(ms)
    for label in labels:
        res = result[label]
        res["ms"] = _median(res["ms_rounds"])
        if case.bytes_moved:
            res["GB/s"] = case.bytes_moved / (res["ms"] * 1e-3) / 1e9
        if case.flops:
            res["TFLOP/s"] = case.flops / (res["ms"] * 1e-3) / 1e12


def launch_overhead() -> dict:
    """Microseconds per call (fwd+bwd, synchronized) at a tiny size: CPU cost, ours vs eager."""
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    g = torch.randn(8, 256, device="cuda")
    pairs = {
        "swiglu": (lambda: gputune_kernels.swiglu(x, x), lambda: F.silu(x) * x),
        "rms_norm": (lambda: gputune_kernels.rms_norm(x, w), lambda: _rms_norm_eager(x, w)),
        "layer_norm": (lambda: gputune_kernels.layer_norm(x, w, w), lambda: F.layer_norm(x, (256,), w, w)),
        "softmax": (lambda: gputune_kernels.softmax(x), lambda: torch.softmax(x, -1)),
        "gelu_tanh": (lambda: gputune_kernels.gelu_tanh(x), lambda: F.gelu(x, approximate="tanh")),
    }
    out = {}
    for name, (ours, eager) in pairs.items():
        for label, fn in (("ours", ours), ("eager", eager)):
            leaves = [x, w] if name in ("rms_norm", "layer_norm") else [x]
            for _ in range(20):
                torch.autograd.grad(fn(), leaves, g)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                torch.autograd.grad(fn(), leaves, g)
            torch.cuda.synchronize()
            out[f"{name} {label}"] = (time.perf_counter() - t0) / 200 * 1e6
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        torch.autograd.grad(gputune_kernels.rms_norm(x, w), [x, w], g)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    print(buf.getvalue()[-3500:])
    return out


def environment() -> dict:
    import triton

    env = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        env["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as exc:  # noqa: BLE001 - the driver version is a nicety
        env["driver"] = f"unknown ({type(exc).__name__})"
    return env


def _fmt(r: dict) -> str:
    if "error" in r:
        return "error"
    s = f"{r['ms']:.3f} ms"
    if "ms_rounds" in r:
        s += f" ({min(r['ms_rounds']):.3f}-{max(r['ms_rounds']):.3f})"
    if "GB/s" in r:
        s += f" {r['GB/s'] / 1000:.2f} TB/s"
    if "ms_graph" in r:
        s += f" [graph {r['ms_graph']:.3f}]"
    if "TFLOP/s" in r:
        s += f" {r['TFLOP/s']:.0f} TF/s"
    return s + f" {r['peak_extra_mib']:.0f} MiB"


def print_table(report: dict) -> None:
    print(f"\n{report['env']['gpu']} · torch {report['env']['torch']} · triton {report['env']['triton']}"
          f" · copy {report['copy']['GB/s'] / 1000:.2f} TB/s")
    print(f"{'case':44} {'ok':3} {'ours':44} {'eager':44} {'compile':44} {'ours+compile':44}")
    print("CPU us per tiny fwd+bwd: " + ", ".join(f"{k} {v:.0f}" for k, v in report["overhead_us"].items()))
    for r in report["cases"]:
        if "error" in r:
            print(f"{r['name']:44} error: {r['error'][:120]}")
            continue
        cells = [_fmt(r[k]) if k in r else "-" for k in ("ours", "eager", "compile", "ours+compile")]
        print(f"{r['name']:44} {'y' if r['correct'] else 'N':3} " + " ".join(f"{c:44}" for c in cells))
        for k in r:
            if k.startswith(("ours[", "anchor[")):
                print(f"  {k:42}     {_fmt(r[k])}")


def _per_call_us(fn, device: str, calls: int = 200) -> float:
    """Microseconds per synchronized call of fn, after 20 warm-up calls (fewer for fewer calls)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(min(20, calls)):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


class NoOpFunction(torch.autograd.Function):
    """The least a custom op's eager path can cost: a Python forward and backward that do nothing."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def host_breakdown(device: str = "cuda", calls: int = 200, rounds: int = 7) -> dict:
    """Where the host's time of a tiny RMSNorm fwd+bwd (8x256, where the GPU work is shorter than
    the host's) goes, in microseconds per synchronized call: the three launches alone (compiled
    kernels, preallocated buffers), the same through Triton's usual launch, one launch beside one
    torch op and beside the torch ops that could replace it, the forward and backward
    implementations without autograd (launches, allocations, our Python), the whole call through
    autograd (with our direct launch, with Triton's, with the partial sums in torch), the same for
    LayerNorm and GELU, and the autograd engine's cost for a custom Function that does nothing.
    Each part is timed in `rounds` interleaved rounds: {part: [us per call, one per round]}. The
    differences say what to cut."""

    from gputune_kernels import _common, _launch, _native, _partial_sums

    rms = importlib.import_module("gputune_kernels.rms_norm")  # the module, not its function

    x = torch.randn(8, 256, device=device, requires_grad=True)
    w = torch.randn(256, device=device, requires_grad=True)
    g = torch.randn(8, 256, device=device)
    xd, wd = x.detach(), w.detach()
    rows, n_cols = xd.shape
    block, warps = _common.row_params(n_cols)
    programs = _common.program_count(xd.device)
    sums_grid = (_common.cdiv(n_cols, _partial_sums.BLOCK_COLS),)
    y, rstd, dx = torch.empty_like(xd), torch.empty(rows, device=device), torch.empty_like(xd)
    dw = torch.empty_like(wd)
    part = torch.empty((programs, n_cols), device=device)

    # (kernel, grid, arguments, keywords) of the three launches a fwd+bwd makes
    three = [
        (rms._rms_norm_fwd_kernel, (rows,), (xd, wd, y, rstd, n_cols, 1e-6),
         dict(BLOCK=block, num_warps=warps)),
        (rms._rms_norm_bwd_kernel, (programs,), (g, xd, wd, rstd, dx, part, rows, n_cols, programs),
         dict(BLOCK=block, num_warps=warps)),
        (_partial_sums._sum_partials_kernel, sums_grid, (part, dw, dw, programs, n_cols),
         dict(TWO=False, BLOCK_PARTS=_partial_sums.BLOCK_PARTS, BLOCK_COLS=_partial_sums.BLOCK_COLS)),
    ]

    # Our launcher outside a custom op's eager call hands the kernel to torch.library's
    # wrap_triton (for tracing), which is what the first H200 run of this part timed (382 us
    # against Triton's 40, 2026-12-01): the custom ops launch under raw_triton, as here.
    def launches():
        with _common.raw_triton():
            for kernel, grid, args, kwargs in three:
                _launch.of(kernel)[grid](*args, **kwargs)

    def usual_launches():  # the same three through Triton's JITFunction.run, for comparison
        for kernel, grid, args, kwargs in three:
            kernel[grid](*args, **kwargs)

    def partial_sums_launch():
        kernel, grid, args, kwargs = three[2]
        with _common.raw_triton():
            _launch.of(kernel)[grid](*args, **kwargs)

    wb = wd.to(torch.bfloat16)

    def impls():
        with _common.raw_triton():
            out, r = rms._rms_norm_impl(xd, wd, 1e-6)
            rms._rms_norm_backward_impl(g, xd, wd, r)

    # LayerNorm beside it: on the H200 its tiny fwd+bwd cost the host 393 us against RMSNorm's
    # 224 (2026-12-01, overhead_us) with the same three launches; which half differs?
    ln = importlib.import_module("gputune_kernels.layer_norm")
    b = torch.randn(256, device=device, requires_grad=True)
    bd = b.detach()

    def ln_impls():
        with _common.raw_triton():
            out, stats = ln._layer_norm_impl(xd, wd, bd, 1e-5)
            ln._layer_norm_backward_impl(g, xd, wd, stats, True)

    def python(fn):  # fn through the Python autograd.Function instead of the C++ node
        def run():
            before = _native.ENABLED
            _native.set_enabled(False)
            try:
                fn()
            finally:
                _native.set_enabled(before)
        return run

    def usual(fn):  # the Python Function with every launch through Triton's own launch
        def run():
            before, _launch._ENABLED = _launch._ENABLED, False
            try:
                python(fn)()
            finally:
                _launch._ENABLED = before
        return run

    def torch_sums(fn):  # fn with the norms' partial sums added by torch (GPUTUNE_PARTIAL_SUMS=torch)
        def run():
            before, _partial_sums.MODE = _partial_sums.MODE, "torch"
            try:
                fn()
            finally:
                _partial_sums.MODE = before
        return run

    def rms_api():
        torch.autograd.grad(gputune_kernels.rms_norm(x, w), [x, w], g)

    def ln_api():
        torch.autograd.grad(gputune_kernels.layer_norm(x, w, b), [x, w, b], g)

    def gelu_api():
        torch.autograd.grad(gputune_kernels.gelu_tanh(x), [x], g)

    parts = {
        "three launches": launches,
        "three launches, Triton's usual launch": usual_launches,
        # is a Triton launch dearer than a torch op? (the partial sums could be torch's)
        "one launch: the partial sums": partial_sums_launch,
        "one torch op: add_": lambda: dw.add_(1.0),
        "the partial sums in torch, into bf16 (sum, copy)": lambda: _partial_sums._column_sums(part, wb),
        "fwd + bwd implementations, no autograd": impls,
        "through the API and autograd": rms_api,
        "the API, Python Function": python(rms_api),
        "the API, Python Function, Triton's usual launch": usual(rms_api),
        "the API, Python Function, partial sums in torch": torch_sums(rms_api),
        "LayerNorm: fwd + bwd implementations, no autograd": ln_impls,
        "LayerNorm: through the API and autograd": ln_api,
        "LayerNorm: the API, Python Function": python(ln_api),
        "LayerNorm: the API, Python Function, Triton's usual launch": usual(ln_api),
        "LayerNorm: the API, Python Function, partial sums in torch": torch_sums(ln_api),
        "GELU: through the API and autograd": gelu_api,
        "GELU: the API, Python Function": python(gelu_api),
        "GELU: the API, Python Function, Triton's usual launch": usual(gelu_api),
        "eager torch: F.layer_norm": lambda: torch.autograd.grad(F.layer_norm(x, (256,), w, b), [x, w, b], g),
        "eager torch: F.gelu tanh": lambda: torch.autograd.grad(F.gelu(x, approximate="tanh"), [x], g),
        "autograd, a Function doing nothing": lambda: torch.autograd.grad(NoOpFunction.apply(x), [x], g),
        "empty_like x4": lambda: [torch.empty_like(xd) for _ in range(4)],
    }
    # Rounds over every part, each round starting one part later, so that no part is always
    # timed first (on the H200 the first part timed once read 391 us against the next one's 41).
    names = list(parts)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(_per_call_us(parts[name], device, calls))
    return times


def _median(values: list) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where to write the results")
    ap.add_argument("--only", default="", help="run only cases whose name contains this (comma-separated)")
    ap.add_argument("--rep-ms", type=float, default=200, help="do_bench repetition time per impl")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--budget-s", type=float, default=math.inf, help="stop starting new cases after this")
    ap.add_argument("--host-rounds", type=int, default=7, help="rounds of the host-time breakdown")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each case's impls this many times, interleaved; report the median and range")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_bench: needs a CUDA device", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    from gputune_kernels import _native

    native = _native.wait(timeout=600)  # the C++ nodes, built once (then cached) before timing
    print(f"C++ autograd nodes: {native} ({time.perf_counter() - t_start:.0f} s)", flush=True)
    report = {"env": environment(), "native": native, "copy": copy_bandwidth(), "cases": []}
    report["overhead_us"] = launch_overhead()
    try:  # diagnostics only: a failure here must not cost the run its cases
        report["host_breakdown_us"] = host_breakdown(rounds=args.host_rounds)
        print(f"host us per tiny RMSNorm fwd+bwd, median (min-max) of {args.host_rounds} rounds:")
        for name, us in report["host_breakdown_us"].items():
            print(f"  {name:55s} {_median(us):6.0f} ({min(us):.0f}-{max(us):.0f})")
    except Exception as exc:
        report["host_breakdown_us"] = {"error": repr(exc)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    wanted = [w for w in args.only.split(",") if w]
    for case in build_cases():
        if wanted and not any(w in case.name for w in wanted):
            continue
        if time.perf_counter() - t_start > args.budget_s:
            report.setdefault("skipped", []).append(case.name)
            continue
        t0 = time.perf_counter()
        try:
            report["cases"].append(run_case(case, args.rep_ms, not args.no_compile, args.rounds))
        except Exception as exc:  # record it and go on to the next case
            report["cases"].append({"name": case.name, "target": case.target, "correct": False,
                                    "error": f"{type(exc).__name__}: {exc}"[:500]})
            torch.cuda.empty_cache()
        print(f"[{time.perf_counter() - t_start:6.1f}s] {case.name}: {time.perf_counter() - t0:.1f}s", flush=True)
        args.json.write_text(json.dumps(report, indent=1))  # after each case: a cut run keeps them
    args.json.write_text(json.dumps(report, indent=1))  # and once more: a run of no case has its host breakdown
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

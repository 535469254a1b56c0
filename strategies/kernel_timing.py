"""How fast each fused kernel is against the module it replaces, on the device at hand.

A `KernelCase` is one kernel and the first module of the model it would replace, with example
inputs at the width the model uses (its norm's width, its MLP's width, its head count, its
vocabulary) and `ROWS` tokens. `time_case` runs forward + backward of both, as eager training
calls them (the modules themselves, under the run's autocast), interleaved, a few warm-up calls
then the median of a few timed ones (CUDA events on a GPU, the wall clock on the CPU).
`TimingCache` keeps the timings in a small JSON file in gputune's folder, keyed by the machine
(GPU name, driver, torch, triton, gputune's code version) and the case, so each is measured
once per machine and code. `verdict` turns a timing into keep or leave.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import warnings
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from strategies.files import ReadError, WriteError, read_capped, write_atomic

ROWS = 8192
"""Tokens per timed call: the row count of the issue's benchmark shapes, large enough that the
GPU is busy, small enough to measure in milliseconds."""
SEQ_LEN = 1024
"""Sequence length of the causal-softmax case (scores are batch x heads x T x T), or the
model's context where that is shorter."""
WIDTH = 4096
"""Activation width where the model does not tell it (no linear layer beside the activation)."""
HEADS = 12
"""Attention heads where the attention module does not say (no `n_head`)."""
WARMUP, REPS = 3, 10
MARGIN = 0.03
"""A kernel up to this much slower than the op it replaces still counts as no slower (noise)."""
MAX_MACHINES = 8
"""Machines (GPU, driver, versions, code) kept in the cache file; the oldest are dropped."""
MAX_FILE_BYTES = 16 << 20
"""A cache file larger than this is not one gputune wrote (a few kernels x 8 machines is a few
KiB): it is measured again and rewritten."""
NOT_TIMED = {"linear_cross_entropy": "its point is memory (the logits are never built)"}
"""Kernels swapped for what they save, not for speed: never left out on a timing."""


@dataclass(frozen=True)
class Timing:
    """Median milliseconds of one forward + backward: ours and the op it replaces."""

    ours_ms: float
    torch_ms: float


@dataclass(frozen=True)
class KernelCase:
    """One kernel against the module it replaces, at one shape."""

    kernel: str
    original: nn.Module
    replacement: nn.Module
    make_inputs: Callable[["KernelCase", torch.Generator], tuple]
    dims: tuple[int, ...]
    """What fixes the shape besides `rows`: a width; heads; hidden size and vocabulary."""
    dtype: torch.dtype
    autocast: torch.dtype | None
    device: torch.device
    rows: int = ROWS

    @property
    def key(self) -> str:
        dims = "x".join(str(d) for d in (self.rows, *self.dims))
        autocast = f" autocast {_dtype_name(self.autocast)}" if self.autocast else ""
        return (f"{self.kernel} {type(self.original).__name__} {dims} "
                f"{_dtype_name(self.dtype)}{autocast}")

    def with_rows(self, rows: int) -> "KernelCase":
        return replace(self, rows=rows)


TimingSource = Callable[[list[KernelCase]], dict[str, "Timing | str"]]
"""Timings by kernel name for the cases given; a string says why a kernel was not timed."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- the cases: example inputs at the model's widths -------------------------------------

def _param_dtype(module: nn.Module, model: nn.Module) -> tuple[torch.dtype, torch.device]:
    for p in (*module.parameters(), *model.parameters()):
        if p.is_floating_point():
            return p.dtype, p.device
    return torch.float32, torch.device("cpu")


def _randn(case: KernelCase, gen: torch.Generator, *shape: int) -> torch.Tensor:
    # A private generator: timing must not move the run's random state (dropout, data).
    x = torch.randn(*shape, generator=gen, device=case.device, dtype=torch.float32)
    return x.to(case.dtype).requires_grad_()


def _rows_by_width(case, gen):
    return (_randn(case, gen, case.rows, *case.dims),)


def _gate_and_up(case, gen):
    return (_randn(case, gen, case.rows, *case.dims), _randn(case, gen, case.rows, *case.dims))


def _scores(case, gen):
    heads, seq = case.dims[0], min(case.dims[1], case.rows)
    return (_randn(case, gen, max(1, case.rows // seq), heads, seq, seq), 0.125)


def _hidden_weight_targets(weight: nn.Parameter):
    def make(case, gen):
        vocab = weight.shape[0]
        targets = torch.randint(vocab, (case.rows,), generator=gen, device=case.device)
        return _randn(case, gen, case.rows, weight.shape[1]), weight, targets

    return make


def _activation_width(parent: nn.Module) -> int:
    """The widest output of a linear layer beside the activation: the MLP's hidden width."""
    widths = [getattr(m, "out_features", None) or getattr(m, "nf", None) for m in parent.children()]
    widths = [w for w in widths if isinstance(w, int)]
    return max(widths) if widths else WIDTH


def _vocab_weight(model: nn.Module) -> nn.Parameter | None:
    """The largest embedding or linear weight: the output projection of a language model."""
    weights = [m.weight for m in model.modules()
               if isinstance(m, (nn.Embedding, nn.Linear)) and m.weight.dim() == 2]
    return max(weights, key=lambda w: w.numel(), default=None)


def _context_length(model: nn.Module) -> int:
    """The model's context (gputune's models: `shape.block_size`; Hugging Face's:
    `config.max_position_embeddings`), at most SEQ_LEN."""
    for holder, name in ((getattr(model, "shape", None), "block_size"),
                         (getattr(model, "config", None), "max_position_embeddings")):
        value = getattr(holder, name, None)
        if isinstance(value, int) and value > 0:
            return min(value, SEQ_LEN)
    return SEQ_LEN


def make_case(kernel: str, parent: nn.Module, original: nn.Module, replacement: nn.Module,
              model: nn.Module, autocast: torch.dtype | None) -> KernelCase | str:
    """The case for `kernel` replacing `original` (a child of `parent`), or why there is none."""
    if kernel in NOT_TIMED:
        return NOT_TIMED[kernel]
    dtype, device = _param_dtype(original, model)
    # Activations and scores come out of matmuls (autocast's dtype); the norms and the loss see
    # the residual stream, in the parameters' dtype.
    activation_dtype = autocast or dtype
    common = {"original": original, "replacement": replacement, "autocast": autocast,
              "device": device}
    if kernel in ("layer_norm", "rms_norm"):
        dims = tuple(original.weight.shape)
        return KernelCase(kernel, make_inputs=_rows_by_width, dims=dims, dtype=dtype, **common)
    if kernel == "gelu":
        return KernelCase(kernel, make_inputs=_rows_by_width, dims=(_activation_width(parent),),
                          dtype=activation_dtype, **common)
    if kernel == "swiglu" and hasattr(original, "gate_proj"):
        return KernelCase(kernel, make_inputs=_rows_by_width,
                          dims=(original.gate_proj.in_features,), dtype=dtype, **common)
    if kernel == "swiglu":
        return KernelCase(kernel, make_inputs=_gate_and_up, dims=(_activation_width(parent),),
                          dtype=activation_dtype, **common)
    if kernel == "causal_softmax":
        heads = getattr(parent, "n_head", None)
        dims = (heads if isinstance(heads, int) else HEADS, _context_length(model))
        return KernelCase(kernel, make_inputs=_scores, dims=dims, dtype=activation_dtype, **common)
    if kernel == "cross_entropy":
        weight = _vocab_weight(model)
        if weight is None:
            return "the model has no embedding or linear weight to take the vocabulary from"
        return KernelCase(kernel, make_inputs=_hidden_weight_targets(weight),
                          dims=tuple(weight.shape[::-1]), dtype=dtype, **common)
    return f"no timing case for kernel {kernel}"


# ---- measuring ---------------------------------------------------------------------------

def _forward_backward(module: nn.Module, inputs: tuple, case: KernelCase) -> Callable[[], None]:
    leaves = [t for t in inputs if torch.is_tensor(t) and t.requires_grad]
    seen = {id(t) for t in leaves}  # the vocabulary weight may be an input and a parameter
    leaves += [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
    grad_out: list[torch.Tensor] = []

    def step() -> None:
        autocast = (torch.autocast(case.device.type, dtype=case.autocast) if case.autocast
                    else contextlib.nullcontext())
        with autocast:
            out = module(*inputs)
        if not grad_out:
            grad_out.append(torch.ones_like(out))
        # autograd.grad, not backward: the model's own .grad stays untouched.
        torch.autograd.grad(out, leaves, grad_out[0], allow_unused=True)

    return step


def _elapsed_ms(step: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    step()
    return (time.perf_counter() - begin) * 1e3


def time_case(case: KernelCase, warmup: int = WARMUP, reps: int = REPS) -> Timing:
    """Median ms of forward + backward of ours and of the original, interleaved so that a
    clock or thermal drift falls on both."""
    gen = torch.Generator(device=case.device).manual_seed(0)
    inputs = case.make_inputs(case, gen)
    ours = _forward_backward(case.replacement, inputs, case)
    theirs = _forward_backward(case.original, inputs, case)
    for _ in range(warmup):  # the first call compiles the Triton kernels
        ours(), theirs()
    if case.device.type == "cuda":
        torch.cuda.synchronize(case.device)
    ours_ms, theirs_ms = [], []
    for _ in range(reps):
        ours_ms.append(_elapsed_ms(ours, case.device))
        theirs_ms.append(_elapsed_ms(theirs, case.device))
    return Timing(statistics.median(ours_ms), statistics.median(theirs_ms))


def verdict(timing: Timing | str, forced: bool = False) -> tuple[bool, str]:
    """(keep, why): a kernel slower than the op it replaces by more than MARGIN is left out,
    unless forced; one that was not timed is kept."""
    if isinstance(timing, str):
        return True, f"kept, not timed: {timing}"
    figures = f"{timing.ours_ms:.3g} ms vs torch {timing.torch_ms:.3g} ms"
    if timing.ours_ms <= timing.torch_ms * (1 + MARGIN):
        return True, f"kept, {figures}"
    if forced:
        return True, f"kept (forced), {figures}"
    return False, f"left, {figures}"


# ---- the cache ---------------------------------------------------------------------------

def machine_here(device: torch.device) -> dict[str, str]:
    """What a timing depends on besides the case: the GPU, its driver, torch, triton, and
    gputune's code (strategies/code_version.py)."""
    import platform

    from strategies.code_version import code_hash
    from strategies.versions import driver_version, triton_version

    gpu = (torch.cuda.get_device_name(device) if device.type == "cuda"
           else f"cpu {platform.processor() or platform.machine()}")
    machine = {"gpu": gpu, "driver": str(driver_version()), "torch": str(torch.__version__),
               "triton": str(triton_version()), "code": code_hash()}
    if device.type == "cuda":  # whether eager calls go through the C++ nodes or Python
        from gputune_kernels import _native

        machine["native"] = _native.status()
    return machine


def machine_key(machine: dict[str, str]) -> str:
    return " | ".join(f"{k} {machine[k]}" for k in sorted(machine))


def default_path() -> Path:
    from strategies.files import gputune_home

    return gputune_home() / "kernel_timings.json"


class TimingCache:
    """Timings in a JSON file: {"machines": {machine key: {"machine", "written", "timings":
    {case key: {"ours_ms", "torch_ms"}}}}}. A case is measured only when its key is missing."""

    def __init__(self, path: Path, machine: dict[str, str]) -> None:
        self.path, self.machine = Path(path), dict(machine)

    def _read(self) -> dict:
        try:
            data = json.loads(read_capped(self.path, MAX_FILE_BYTES))
        except (ReadError, ValueError):  # missing or damaged: measured again, then rewritten
            return {}
        machines = data.get("machines") if isinstance(data, dict) else None
        return machines if isinstance(machines, dict) else {}

    def timings(self, cases: list[KernelCase],
                measure: Callable[[KernelCase], Timing] = time_case) -> dict[str, Timing | str]:
        """Timing by kernel for `cases`: from the file where it holds them, else measured and
        written back. A case that fails to run is reported by its error and not stored."""
        machines = self._read()
        key = machine_key(self.machine)
        entry = machines.get(key) if isinstance(machines.get(key), dict) else {}
        stored = entry.get("timings") if isinstance(entry.get("timings"), dict) else {}
        result: dict[str, Timing | str] = {}
        measured = False
        for case in cases:
            found = stored.get(case.key)
            try:
                result[case.kernel] = Timing(float(found["ours_ms"]), float(found["torch_ms"]))
                continue
            except (TypeError, KeyError, ValueError):
                pass
            try:
                timing = measure(case)
            except Exception as exc:  # noqa: BLE001 - out of memory, a kernel that fails to build
                first_line = (str(exc).splitlines() or [""])[0][:200]
                result[case.kernel] = f"{type(exc).__name__}: {first_line}"
                continue
            stored[case.key] = {"ours_ms": timing.ours_ms, "torch_ms": timing.torch_ms}
            result[case.kernel] = timing
            measured = True
        if measured:
            written = datetime.now(timezone.utc).isoformat(timespec="seconds")
            machines[key] = {"machine": self.machine, "written": written, "timings": stored}
            newest = sorted(machines, key=lambda k: str(machines[k].get("written", "")))
            for old in newest[:-MAX_MACHINES]:
                del machines[old]
            self._write({"format": 1, "machines": machines})
        return result

    def _write(self, data: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except (OSError, WriteError) as exc:  # the timings still decide this run
            warnings.warn(f"kernel timings not stored: {exc}", stacklevel=2)


def cached_timings(cases: list[KernelCase]) -> dict[str, Timing | str]:
    """The default timing source on a GPU: the per-user cache, measuring what it lacks."""
    if not cases:
        return {}
    result = TimingCache(default_path(), machine_here(cases[0].device)).timings(cases)
    if cases[0].device.type == "cuda":
        torch.cuda.empty_cache()  # the example inputs must not stay reserved in the run's peak
    return result

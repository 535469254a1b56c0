"""Where a step's time goes: pure functions from a profiler's activities to a summary.

`profiler.py` (in the worker) runs torch.profiler over a few steady steps and turns its events
into `Activity` records; `summarize` turns those into plain data: the step split into
categories whose shares add up to 1, the matmuls' achieved TFLOP/s against the peak of their
dtype, launches per step, the most expensive kernels, and a verdict (`bottleneck`) with its
evidence and the options that address it. Torch-free, so the dashboard, the tables and the
tests read it, and recorded activities replay without a GPU.

On a GPU the shares are of the GPU's timeline: kernels and copies, and idle where no kernel
runs (the host is the limit). On the CPU they are of the wall time: the ops' own time, and
idle where no op runs (Python between the ops).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import astuple, dataclass, field

from tuner_tui.engine import matmul_flops

CATEGORIES = ("matmul", "attention", "elementwise", "optimizer", "copy", "communication", "idle")
"""Shares of the step, in display order. elementwise holds norms, activations, reductions and
every other kernel; attention holds SDPA/flash kernels and the attention softmax (manual
attention's batched matmuls count as matmul)."""

CATEGORY_NAMES = {
    "matmul": "matmul", "attention": "attention", "elementwise": "norm/elementwise",
    "optimizer": "optimizer", "copy": "memory copies", "communication": "communication",
    "idle": "idle",
}

BOTTLENECKS = ("host", "memory", "compute", "communication")

HOST_IDLE = 0.3
"""Idle share from which the step is called host-bound: a third of the time, the device waits."""
EXPOSED_COMMUNICATION = 0.2
"""Share of collectives not hidden behind compute from which the step is called communication-bound."""

STEP_MARKER = "gputune.step#"
"""Name prefix of the record_function that `profiler.py` puts around each profiled step."""

_OPTIMIZER = re.compile(r"^Optimizer\.|_fused_adam|fused_sgd")
_COMMUNICATION = re.compile(
    r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_to_all", re.I)
_ATTENTION = re.compile(
    r"scaled_dot_product|sdpa|flash|fmha|efficient_attention|cudnn_attention|attention|"
    r"(?<!log_)(?<!log)softmax", re.I)
_MATMUL = re.compile(
    r"\b(aten::)?(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv|dot|conv(olution|[123]d)\w*)\b|"
    r"gemm|gemv|cutlass|xmma|cublas|wgmma|nvjet|triton_tem_\w*mm", re.I)
_COPY = re.compile(r"aten::(copy_|_to_copy|to|clone|contiguous|_copy_from\w*)$|memcpy|memset", re.I)
_LAUNCH = re.compile(r"LaunchKernel|GraphLaunch|cudaMemcpyAsync|cudaMemsetAsync|hipLaunch", re.I)

DEVICE_KINDS = ("kernel", "memcpy", "memset")


@dataclass(frozen=True)
class Activity:
    """One event of a profile, as plain values."""

    name: str
    kind: str
    """op (a CPU operator), annotation (a record_function: a step marker, Optimizer.step),
    runtime (a CUDA runtime call), kernel, memcpy or memset (on the device)."""
    start_us: float
    end_us: float
    track: int = 0
    """CPU thread id, or the device stream."""
    id: int = 0
    """A CPU op's correlation id."""
    link: int = 0
    """On a device activity or runtime call: the correlation id of the CPU op that launched it."""
    flops: float = 0.0
    """A matmul or attention op's FLOPs, counted from its input shapes (`matmul_flops`)."""
    dtype: str = ""
    """The dtype of the op's first floating input (matmuls: for the peak to compare with)."""
    profiler_flops: float = 0.0
    """The profiler's own count for the same op where it has one (a cross-check), else 0."""

    @property
    def duration_us(self) -> float:
        return max(0.0, self.end_us - self.start_us)

    def to_row(self) -> list:
        return list(astuple(self))

    @classmethod
    def from_row(cls, row: list) -> "Activity":
        return cls(*row)


# -- categories ----------------------------------------------------------------------------------


def categorize(chain: list[str], kernel: str = "", kind: str = "op") -> str:
    """The category of a kernel (`kernel`, its launching op's chain) or of an op's own time
    (`chain`: its name, then its enclosing ops' and annotations', innermost first)."""
    if kind in ("memcpy", "memset"):
        return "copy"
    if any(_OPTIMIZER.search(n) for n in chain):
        return "optimizer"
    if _COMMUNICATION.search(kernel) or any(_COMMUNICATION.search(n) for n in chain):
        return "communication"
    if _ATTENTION.search(kernel) or any(_ATTENTION.search(n) for n in chain):
        return "attention"
    if kernel and _MATMUL.search(kernel):
        return "matmul"
    for name in chain:  # the innermost op that says what it is
        if _MATMUL.search(name):
            return "matmul"
        if _COPY.search(name):
            return "copy"
    return "elementwise"


# -- the op tree -----------------------------------------------------------------------------------


class _Ops:
    """CPU ops and annotations nested per thread by time: each one's parent and children."""

    def __init__(self, activities: list[Activity]) -> None:
        self.items = sorted(
            (a for a in activities if a.kind in ("op", "annotation")),
            key=lambda a: (a.track, a.start_us, -a.end_us),
        )
        self.parent: list[int | None] = [None] * len(self.items)
        self.children: list[list[int]] = [[] for _ in self.items]
        stack: list[int] = []
        track = None
        for i, a in enumerate(self.items):
            if a.track != track:
                stack, track = [], a.track
            while stack and self.items[stack[-1]].end_us <= a.start_us:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
                self.children[stack[-1]].append(i)
            stack.append(i)
        self.by_id = {a.id: i for i, a in enumerate(self.items) if a.id}
        self._chains: dict[int, list[str]] = {}
        self._counted: dict[int, int | None] = {}

    def chain(self, i: int) -> list[str]:
        if i not in self._chains:
            names, j = [], i
            while j is not None:
                names.append(self.items[j].name)
                j = self.parent[j]
            self._chains[i] = names
        return self._chains[i]

    def counted(self, i: int) -> int | None:
        """The op whose counted FLOPs cover op i: the outermost matmul or attention op with
        FLOPs among i and its enclosing ops (an inner one's work is part of it), or None."""
        if i not in self._counted:
            parent = self.parent[i]
            outer = self.counted(parent) if parent is not None else None
            a = self.items[i]
            own = i if a.flops > 0 and matmul_flops.family(a.name) else None
            self._counted[i] = outer if outer is not None else own
        return self._counted[i]

    def own_intervals(self, i: int) -> list[tuple[float, float]]:
        """The op's interval less its children's: the time it spends itself."""
        a = self.items[i]
        spans, cursor = [], a.start_us
        for c in self.children[i]:
            child = self.items[c]
            if child.start_us > cursor:
                spans.append((cursor, min(child.start_us, a.end_us)))
            cursor = max(cursor, child.end_us)
        if a.end_us > cursor:
            spans.append((cursor, a.end_us))
        return spans


def _split_time(spans: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Time of each category in [start, end]; idle where nothing runs. Where activities overlap,
    the moment is split evenly between them, so the times add up to end - start; communication
    counts only where nothing else runs (collectives hidden behind compute cost no time)."""
    points = sorted({start, end, *(max(start, min(end, p)) for s, e, _ in spans for p in (s, e))})
    delta: dict[float, list[tuple[str, int]]] = defaultdict(list)
    for s, e, cat in spans:
        s, e = max(start, s), min(end, e)
        if e > s:
            delta[s].append((cat, 1))
            delta[e].append((cat, -1))
    active: dict[str, int] = defaultdict(int)
    totals = {c: 0.0 for c in CATEGORIES}
    for left, right in zip(points, points[1:]):
        for cat, d in delta.get(left, ()):
            active[cat] += d
        width = right - left
        if width <= 0:
            continue
        running = {c: n for c, n in active.items() if n > 0}
        compute = {c: n for c, n in running.items() if c != "communication"}
        share = compute or running
        if not share:
            totals["idle"] += width
            continue
        count = sum(share.values())
        for cat, n in share.items():
            totals[cat] += width * n / count
    return totals


# -- the summary -----------------------------------------------------------------------------------


def _precision(dtype: str, float32: str) -> str:
    d = dtype.lower()
    if "bfloat16" in d:
        return "bf16"
    if "half" in d or "float16" in d:
        return "fp16"
    if "float8" in d:
        return "fp8"
    return float32


@dataclass
class _Window:
    """What the steps after the lead-in did: the window on the timeline, its activities by
    category, the matmuls' work and time per launching op, and the launch counts."""

    start: float
    end: float
    spans: list = field(default_factory=list)
    """(start, end, category) of every activity."""
    named: list = field(default_factory=list)
    """(name, start, end, category), to rank the costliest."""
    counted_time: dict = field(default_factory=dict)
    """Op index -> time in µs of each op whose FLOPs are counted (`_Ops.counted`): its kernels'
    and its inner ops' kernels' on a device, its duration on the CPU."""
    launches: int = 0
    kernels: int = 0


def _device_window(activities: list[Activity], ops: _Ops, step_of) -> _Window:
    """The device's timeline from the end of the lead-in step's last kernel to the last one's."""
    device_acts = [a for a in activities if a.kind in DEVICE_KINDS]
    lead_in_ends = [a.end_us for a in device_acts if a.link in ops.by_id
                    and step_of(ops.items[ops.by_id[a.link]].start_us) == 0]
    first = min((a.start_us for a in device_acts), default=0.0)
    start = max(lead_in_ends) if lead_in_ends else first
    w = _Window(start, max((a.end_us for a in device_acts), default=start))
    for a in device_acts:
        op = ops.by_id.get(a.link)
        cat = categorize(ops.chain(op) if op is not None else [], a.name, a.kind)
        w.spans.append((a.start_us, a.end_us, cat))
        w.named.append((a.name, a.start_us, a.end_us, cat))
        owner = ops.counted(op) if op is not None and a.kind == "kernel" else None
        if owner is not None and a.end_us > start:
            w.counted_time[owner] = w.counted_time.get(owner, 0.0) + a.duration_us
        w.kernels += a.kind == "kernel" and a.end_us > start
    w.launches = sum(1 for a in activities if a.kind == "runtime" and _LAUNCH.search(a.name)
                     and step_of(a.start_us) >= 1)
    return w


def _cpu_window(ops: _Ops, steps: list[Activity]) -> _Window:
    """The wall time of the steps after the lead-in: each op's own time (less its children's);
    annotations' own time is Python between the ops, left as idle."""
    w = _Window(steps[1].start_us, max(s.end_us for s in steps))
    for i, a in enumerate(ops.items):
        if a.kind != "op":
            continue
        cat = categorize(ops.chain(i))
        for s, e in ops.own_intervals(i):
            w.spans.append((s, e, cat))
            w.named.append((a.name, s, e, cat))
        inside = w.start <= a.start_us < w.end
        w.launches += inside and not any(ops.items[c].kind == "op" for c in ops.children[i])
        if inside and ops.counted(i) == i:
            w.counted_time[i] = a.duration_us
    return w


def summarize(
    activities: list[Activity],
    device: str,
    *,
    measured_step_ms: float | None = None,
    peaks: dict[str, tuple[float, str]] | None = None,
    float32: str = "fp32",
    config: dict | None = None,
    compile_counts: dict | None = None,
) -> dict:
    """The profile of a few steps, as plain data (see the module's docstring).

    The first marked step is a lead-in: on a device the window starts where its work ends (so
    the device is as far behind the host as in steady state) and covers the steps after it.
    `measured_step_ms`: the unprofiled median step time; on a device, the profiler's own host
    overhead makes a host-bound step slower, and the difference is taken out of the idle time.
    `peaks`: TFLOP/s and their source per precision (fp32, tf32, bf16, fp16); `float32`: the
    precision fp32 matmuls ran in (tf32 where allowed); `config`: the configuration, so that the
    suggestions leave out what it already does."""
    steps = sorted((a for a in activities if a.name.startswith(STEP_MARKER)),
                   key=lambda a: a.start_us)
    if len(steps) < 2:
        raise ValueError("a profile needs at least two marked steps (a lead-in and one measured)")
    ops = _Ops(activities)
    starts = [s.start_us for s in steps]

    def step_of(t: float) -> int:
        return max(0, bisect.bisect_right(starts, t) - 1)

    on_device = device != "cpu"
    w = _device_window(activities, ops, step_of) if on_device else _cpu_window(ops, steps)
    measured = len(steps) - 1
    window = max(w.end - w.start, 1e-9)
    totals = _split_time(w.spans, w.start, w.end)
    profiled_step_ms = window / measured / 1e3
    if on_device and measured_step_ms and profiled_step_ms > measured_step_ms:
        # What the profiler added to the host's work shows on the device as idle time: taken
        # out. (On the CPU its cost is spread over the ops and the time between them.)
        extra = min(totals["idle"], (profiled_step_ms - measured_step_ms) * measured * 1e3)
        totals["idle"] -= extra
        window -= extra
    profile = {
        "device": device,
        "timeline": "GPU" if on_device else "CPU",
        "steps": measured,
        "step_ms": profiled_step_ms,
        "measured_step_ms": measured_step_ms,
        "categories": {c: totals[c] / window for c in CATEGORIES},
        "matmul": _flop_rates(ops, w.counted_time, matmul_flops.MATMUL, measured, peaks or {},
                              float32),
        "sdpa": _flop_rates(ops, w.counted_time, matmul_flops.ATTENTION, measured, peaks or {},
                            float32),
        "launches_per_step": w.launches / measured,
        "kernels_per_step": w.kernels / measured if on_device else None,
        "top_kernels": _top(w.named, w.start, w.end, window),
        "compile": dict(compile_counts or {}),
    }
    profile.update(verdict(profile, config or {}))
    return profile


def _flop_rates(ops: _Ops, time_us: dict, family: str, steps: int, peaks: dict,
                float32: str) -> list[dict]:
    """Achieved TFLOP/s per precision of the counted ops of `family` (`matmul_flops`): their
    FLOPs from the shapes over their time, against the precision's peak where one is known;
    the profiler's own FLOP count of the same ops beside it where it has one."""
    by_precision: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, us in time_us.items():
        a = ops.items[i]
        if matmul_flops.family(a.name) == family:
            totals = by_precision[_precision(a.dtype, float32)]
            totals[0] += a.flops
            totals[1] += us
            totals[2] += a.profiler_flops
    total_us = sum(us for _, us, _ in by_precision.values())
    rates = []
    for p, (flops, us, profiler_flops) in sorted(by_precision.items(), key=lambda kv: -kv[1][1]):
        if us <= 0:
            continue
        tflops = flops / (us * 1e-6) / 1e12
        peak, source = peaks.get(p, (None, ""))
        rates.append({
            "precision": p, "tflops": tflops, "peak_tflops": peak,
            "of_peak": tflops / peak if peak else None, "peak_source": source,
            "share_of_time": us / total_us, "flops_per_step": flops / steps,
            "ms_per_step": us / steps / 1e3,
            "profiler_flops_per_step": profiler_flops / steps if profiler_flops else None,
        })
    return rates


def _top(named: list, start: float, end: float, window: float, n: int = 5) -> list[dict]:
    time_of: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    category: dict[str, str] = {}
    for name, s, e, cat in named:
        overlap = min(e, end) - max(s, start)
        if overlap > 0:
            time_of[name] += overlap
            calls[name] += 1
            category[name] = cat
    ranked = sorted(time_of, key=lambda k: -time_of[k])[:n]
    return [{"name": k[:160], "share": time_of[k] / window, "category": category[k],
             "calls": calls[k]} for k in ranked]


def flop_rate(tflops: float) -> str:
    """12.3 TFLOP/s, or 45.6 GFLOP/s below one TFLOP/s (the CPU's tiny models)."""
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def flop_line(profile: dict) -> str | None:
    """The achieved rate of the matmuls (and of SDPA) per precision against its peak, in one
    line: "matmul: 412.3 TFLOP/s bf16 = 42% of peak; SDPA: 180.2 TFLOP/s bf16 = 18% of peak".
    None where the step has neither."""
    cpu = profile["timeline"] == "CPU"

    def rate(r: dict) -> str:
        text = f"{flop_rate(r['tflops'])} {r['precision']}"
        if r["of_peak"] is not None:
            return f"{text} = {r['of_peak']:.0%} of peak"
        return text if cpu else f"{text} (no {r['precision']} peak known)"

    parts = [f"{title}: " + ", ".join(rate(r) for r in profile[key])
             for key, title in (("matmul", "matmul"), ("sdpa", "SDPA")) if profile.get(key)]
    if cpu and parts:
        parts[-1] += " (no peak on the CPU)"
    if not profile.get("matmul") and profile["categories"]["matmul"] >= 0.01:
        # CUDA graphs replay kernels without their ops; Triton matmuls have no aten op.
        parts.insert(0, "matmul: TFLOP/s unknown (its kernels ran without a matmul op to count)")
    return "; ".join(parts) or None


# -- the verdict -----------------------------------------------------------------------------------


def verdict(profile: dict, config: dict) -> dict:
    """`bottleneck`, `evidence` (one line) and `suggestions` (what addresses it, leaving out what
    the configuration already does)."""
    c = profile["categories"]
    where = "GPU" if profile["timeline"] == "GPU" else "CPU"
    compute = c["matmul"] + c["attention"]
    memory = c["elementwise"] + c["copy"] + c["optimizer"]
    launches = profile["launches_per_step"]
    if c["idle"] >= HOST_IDLE:
        kind = "host"
        if where == "GPU":
            evidence = (f"the GPU is idle {c['idle']:.0%} of the step, waiting for the host to "
                        f"launch {launches:,.0f} kernels per step")
        else:
            evidence = (f"{c['idle']:.0%} of the step is spent outside any op (Python and "
                        f"dispatch between {launches:,.0f} ops per step)")
    elif c["communication"] >= EXPOSED_COMMUNICATION:
        kind = "communication"
        evidence = (f"collectives not hidden behind compute take {c['communication']:.0%} of "
                    "the step")
    elif compute >= memory:
        kind = "compute"
        rate = profile["matmul"][0] if profile["matmul"] else None
        evidence = f"matmuls and attention take {compute:.0%} of the step"
        if rate and rate["of_peak"] is not None:
            evidence += (f", the matmuls at {flop_rate(rate['tflops'])} ({rate['of_peak']:.0%} of "
                         f"the {rate['precision']} peak)")
        elif rate:
            evidence += f", the matmuls at {flop_rate(rate['tflops'])} ({rate['precision']})"
    else:
        kind = "memory"
        evidence = (f"norms, elementwise, copies and the optimizer take {memory:.0%} of the step "
                    f"against {compute:.0%} in matmuls and attention: it moves memory more than "
                    "it computes")
    return {"bottleneck": kind, "evidence": evidence,
            "suggestions": suggestions(kind, config, where == "GPU")}


def suggestions(bottleneck: str, config: dict, gpu: bool = True) -> list[str]:
    """What addresses `bottleneck`, as "option=value: why" lines; `gpu`: options that need
    CUDA (CUDA graphs, Triton kernels, tf32, fp8) are offered only there."""
    mode = config.get("compile_mode", "off")
    precision = config.get("precision", "fp32")
    kernels = set(config.get("fused_kernels") or ())
    found: list[str] = []
    if bottleneck == "host":
        if gpu and mode != "reduce-overhead":
            found.append("compile_mode=reduce-overhead: CUDA graphs launch the whole step at once")
        if mode == "off":
            found.append("compile_mode=default: Inductor fuses many small kernels into few")
        if config.get("optimizer", "plain") == "plain":
            found.append("optimizer=fused: one update kernel instead of several per parameter")
        found.append("a larger micro-batch (batch_size): more work per launch")
    elif bottleneck == "memory":
        missing = {"layer_norm", "gelu", "rms_norm", "swiglu", "linear_cross_entropy"} - kernels
        if gpu and missing:  # Triton kernels: CUDA only
            found.append("fused_kernels (" + ", ".join(sorted(missing)) + "): fewer trips to memory")
        if mode == "off":
            found.append("compile_mode=default: Inductor fuses elementwise ops and norms")
        if config.get("optimizer", "plain") != "fused":
            found.append("optimizer=fused: the update reads each parameter once")
    elif bottleneck == "compute":
        if precision in ("fp32", "tf32"):
            found.append("precision=bf16: tensor cores at several times the fp32 rate")
        if gpu and precision == "fp32":
            found.append("precision=tf32: fp32 matmuls on tensor cores")
        if gpu:
            found.append("fp8 matmuls (float8 training) where the GPU has them")
        if config.get("attention", "manual") == "manual":
            found.append("attention=sdpa: a flash-attention kernel")
    elif bottleneck == "communication":
        found += ["FSDP2: reshard_after_forward=False keeps parameters between forward and backward",
                  "larger gradient buckets (DDP bucket_cap_mb) or FSDP2 prefetch to overlap "
                  "communication with compute"]
    return found


def describe(profile: dict, width: int = 100) -> list[str]:
    """Lines for a terminal: the shares, the matmul rates, the verdict and what to try."""
    c = profile["categories"]
    shares = ", ".join(f"{CATEGORY_NAMES[k]} {c[k]:.0%}" for k in CATEGORIES if c[k] >= 0.005)
    lines = [f"{profile['timeline']} time: {shares}"]
    facts = [f"{profile['launches_per_step']:,.0f} "
             + ("launches" if profile["timeline"] == "GPU" else "ops") + "/step"]
    counts = profile.get("compile") or {}
    if counts.get("graphs"):
        facts.append(f"compile: {counts['graphs']} graphs, {counts.get('graph_breaks', 0)} breaks, "
                     f"{counts.get('recompiles', 0)} recompiles")
    lines.append("; ".join(facts))
    if rates := flop_line(profile):
        lines.append(rates)
    lines.append(f"bottleneck: {profile['bottleneck']}: {profile['evidence']}")
    if len(profile.get("ranks") or ()) > 1:  # a worker group: each rank's own verdict
        lines.append("ranks: " + "; ".join(
            f"{r['rank']} {r['bottleneck']}, {r['step_ms']:.1f} ms, communication "
            f"{r['communication'] or 0:.0%}" for r in profile["ranks"]))
    for s in profile["suggestions"]:
        lines.append(f"  try {s}")
    for k in profile["top_kernels"][:5]:
        name = k["name"] if len(k["name"]) <= width - 12 else k["name"][: width - 13] + "…"
        lines.append(f"  {k['share']:5.1%}  {name}")
    if profile.get("trace"):
        lines.append(f"trace: {profile['trace']}")
    return lines

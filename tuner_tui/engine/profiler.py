"""Profiling a run in the worker: torch.profiler over a few steady steps of a `Trainer`, after
its measured steps, turned into plain `Activity` records and summarized by `profile.summarize`.

The profiled steps come after the measurement and their records are dropped, so the profiler's
cost never reaches a measured row.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tuner_tui.engine import matmul_flops
from tuner_tui.engine import profile as analysis
from tuner_tui.engine.mfu import PEAK_TFLOPS
from tuner_tui.engine.profile import STEP_MARKER, Activity

PROFILE_STEPS = 3
"""Steps summarized (after one lead-in step that is profiled but not counted)."""

_KINDS = {
    "cpu_op": "op", "user_annotation": "annotation", "kernel": "kernel", "gpu_memcpy": "memcpy",
    "gpu_memset": "memset", "cuda_runtime": "runtime", "cuda_driver": "runtime",
}


def compile_counters() -> dict:
    """torch.compile's counters so far in this process (graphs compiled, graph breaks)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def compile_counts(before: dict | None) -> dict:
    """Graphs, graph breaks and recompiles of the run built after `before` was taken. Dynamo's
    guard failures (each one a recompile) are cleared when a run is built (`release_memory`)."""
    from torch._dynamo.utils import guard_failures

    now = compile_counters()
    before = before or {}
    counts = {k: now[k] - before.get(k, 0) for k in now}
    counts["recompiles"] = sum(len(v) for v in guard_failures.values())
    return counts


def _kind(e) -> str | None:
    """The event's kind (a value of _KINDS), or None for events the summary leaves out."""
    activity = getattr(e, "activity_type", None)
    if activity:
        return _KINDS.get(str(activity))
    # torch before 2.12 (the H200 machine's 2.11) has no activity_type: tell the kinds from the
    # device, the annotation flag and the name.
    on_device = str(getattr(e, "device_type", "")).rsplit(".", 1)[-1] == "CUDA"
    annotation = bool(getattr(e, "is_user_annotation", False))
    name = e.name
    if on_device:
        if annotation:
            return None  # the GPU-side copy of a record_function
        lowered = name.lower()
        return "memcpy" if lowered.startswith("memcpy") else (
            "memset" if lowered.startswith("memset") else "kernel")
    if annotation:
        return "annotation"
    if name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper()):
        return "runtime"
    return "op"


def raw_details(prof) -> tuple[dict, dict]:
    """From the profiler's raw (Kineto) events, which carry them in every torch version (its
    FunctionEvents lack links and dtypes before torch 2.12): (counted, links). counted: op id ->
    (FLOPs from the input shapes, the dtype of its first floating input) for the operators
    `matmul_flops` counts; links: the correlation id of a kernel, copy or runtime call -> the id
    of the op that launched it."""
    counted, links = {}, {}
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        return counted, links
    for k in results.events():
        linked = k.linked_correlation_id()
        if linked > 0:
            links[k.correlation_id()] = linked
            continue
        name = k.name()
        if matmul_flops.family(name) is None:
            continue
        scalars = list(k.concrete_inputs()) if hasattr(k, "concrete_inputs") else []
        flops = matmul_flops.op_flops(name, k.shapes(), scalars)
        if flops > 0:
            dtype = next((d for d in k.dtypes() if "float" in d.lower() or "half" in d.lower()), "")
            counted[k.correlation_id()] = (flops, dtype)
    return counted, links


def activities_of(events, counted: dict | None = None, links: dict | None = None) -> list[Activity]:
    """The profiler's FunctionEvents as plain records; `counted` and `links` from `raw_details`
    (where left out, the FunctionEvents' own links are used, from torch 2.12 on)."""
    counted = counted or {}
    links = links or {}
    found = []
    for e in events:
        kind = _kind(e)
        if kind is None:
            continue
        device = kind in analysis.DEVICE_KINDS
        is_op = kind in ("op", "annotation")
        flops, dtype = counted.get(int(e.id), (0.0, "")) if kind == "op" else (0.0, "")
        link = 0 if is_op else links.get(int(e.id), 0) or int(
            getattr(e, "linked_correlation_id", 0) or 0)
        found.append(Activity(
            name=e.name, kind=kind, start_us=float(e.time_range.start),
            end_us=float(e.time_range.end),
            track=int(getattr(e, "device_resource_id", 0) or 0) if device else int(e.thread),
            id=int(e.id) if is_op else 0, link=link, flops=flops, dtype=dtype,
            profiler_flops=float(getattr(e, "flops", 0) or 0) if flops else 0.0,
        ))
    return found


def activities_of_profile(prof) -> list[Activity]:
    """The activities of a finished torch.profiler run."""
    return activities_of(prof.events(), *raw_details(prof))


def peaks_for(trainer) -> dict[str, tuple[float, str]]:
    """Datasheet peaks of this GPU per precision, and the configuration's own (probed where the
    GPU is not in the table). None on the CPU, where no peak is trustworthy (see Trainer.mfu)."""
    if trainer.device != "cuda":
        return {}
    peaks = {}
    for key, table in PEAK_TFLOPS:
        if key in trainer.device_name:
            peaks = {p: (t, f"datasheet: {trainer.device_name} {p} dense") for p, t in table.items()}
            break
    own = trainer.peak()
    peaks.setdefault(trainer.config.precision, (own.tflops, own.source))
    return peaks


def float32_precision() -> str:
    try:
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    except Exception:
        return "fp32"


@contextlib.contextmanager
def _without_kineto_chatter():
    """Kineto prints a line to the process's stderr when profiling starts and stops, whatever
    its log level; in the dashboard's terminal it would land over the screen. Everything else
    written to stderr meanwhile is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(("USDT:", "STAGE:")):
                    sys.stderr.write(line)


def capture(trainer, steps: int = PROFILE_STEPS, trace_path: str | None = None) -> list[Activity]:
    """The activities of one lead-in step and `steps` more of a built, warmed-up trainer, each
    inside a step marker; the trainer's records of these steps are dropped afterwards."""
    trainer.finish()
    kept = len(trainer.records)
    activities = [ProfilerActivity.CPU]
    if trainer.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        with _without_kineto_chatter(), profile(
            activities=activities, record_shapes=True, with_flops=True
        ) as prof:
            for i in range(steps + 1):
                with record_function(f"{STEP_MARKER}{i}"):
                    trainer.step()
            trainer.finish()
    finally:
        del trainer.records[kept:]
    if trace_path:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    return activities_of_profile(prof)


def profile_trainer(
    trainer,
    steps: int = PROFILE_STEPS,
    trace_path: str | None = None,
    measured_step_ms: float | None = None,
    compile_before: dict | None = None,
) -> dict:
    """The summary (`profile.summarize`) of `steps` profiled steps of a measured trainer."""
    started = time.perf_counter()
    records = capture(trainer, steps, trace_path)
    summary = analysis.summarize(
        records, trainer.device, measured_step_ms=measured_step_ms, peaks=peaks_for(trainer),
        float32=float32_precision(), config=trainer.config.to_dict(),
        compile_counts=compile_counts(compile_before),
    )
    if trace_path:
        summary["trace"] = str(trace_path)
    summary["profiler_s"] = time.perf_counter() - started
    return summary

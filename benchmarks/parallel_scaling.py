"""Data parallel scaling: one GPU beside DDP and FSDP2 on N GPUs, with the same per-GPU work.

    python3 benchmarks/parallel_scaling.py --workload llama-1b --per-gpu-batch 4 \
        --json out/parallel-llama-1b.json
    python3 benchmarks/parallel_scaling.py --faults --json out/parallel-faults.json
    python3 benchmarks/parallel_scaling.py --summarize out/parallel-llama-1b.json

Every row is bf16 autocast, SDPA and fused AdamW, eager and then torch.compile (per block, as
torchtitan compiles under FSDP2), trained by gputune's own worker: one GPU at batch B, then a
group of N ranks (parallel = ddp, fsdp2) at the global batch N x B. Scaling is the group's
tokens/s / (N x the one-GPU tokens/s) of the same per-GPU configuration. The rows share one
worker (and the two groups of a mode one set of ranks), to keep the run short; each
configuration is built afresh from the same seeded weights. DDP and FSDP2 train on the same
global batch, so their losses are compared too.

--ladder 1,2,4,8: the compiled rows only, DDP and FSDP2 with the knobs that scaled best on two
GPUs (issue 15: FSDP2 not resharding, gradients reduced in bf16; DDP's 100 MB bucket views), at
each number of GPUs this machine has; the sizes it lacks are listed as not run, so one command
serves every machine. --plot FILE.svg draws scaling against GPUs from result files.

--faults: a live DDP run whose rank 1 is killed (the time until the worker reports it, and until
a new group trains), then a configuration too large for the GPUs (a real out of memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner_tui.engine import noise, protocol  # noqa: E402
from tuner_tui.engine.bench import start_worker  # noqa: E402
from tuner_tui.engine.client import WorkerSpec  # noqa: E402
from strategies import TuneConfig  # noqa: E402
from strategies.registry import OPTIONS  # noqa: E402

BASE = {"precision": "bf16", "attention": "sdpa", "optimizer": "fused"}
COMPILE = {"compile_mode": "default", "compile_scope": "block"}
# --knobs: the compiled groups again with the settings that trade memory for overlap: FSDP2
# keeping the gathered parameters from forward to backward (no second all-gather), then also
# reducing gradients in bf16 (half the bytes), DDP with larger buckets whose gradients are views
# into them.
KNOBS = ({"parallel": "fsdp2", "fsdp_reshard": False},
         {"parallel": "fsdp2", "fsdp_reshard": False, "fsdp_reduce": "bf16"},
         {"parallel": "ddp", "ddp_bucket_mb": 100, "ddp_bucket_view": True})
KNOB_KEYS = ("fsdp_reshard", "fsdp_reduce", "ddp_bucket_mb", "ddp_bucket_view")
# --ladder: each mode at the knobs that scaled best on two H200s (call15, call20).
LADDER_KNOBS = {"fsdp2": {"fsdp_reshard": False, "fsdp_reduce": "bf16"},
                "ddp": {"ddp_bucket_mb": 100, "ddp_bucket_view": True}}
GIB = 1024**3


def wait_for(client, kinds, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = client.wait_event(min(1.0, max(0.01, deadline - time.monotonic())))
        if isinstance(event, kinds):
            return event
        if isinstance(event, (protocol.WorkerLog, protocol.RunStarted, protocol.CompileStarted)):
            # On stderr with the time: a check cut by its limit still shows where its time went.
            print(f"[{time.strftime('%H:%M:%S')}] {type(event).__name__}: "
                  f"{getattr(event, 'text', '') or getattr(event, 'label', '')}",
                  file=sys.stderr, flush=True)
        if event is None and not client.is_alive():
            return None
    return None


def run_trial(client, config: dict, steps: int, warmup: int, timeout: float,
              profile_steps: int = 0) -> dict:
    client.send(protocol.RunTrial(TuneConfig.from_dict(config), steps=steps, warmup_steps=warmup,
                                  profile_steps=profile_steps))
    event = wait_for(client, (protocol.TrialFinished, protocol.RunFailed), timeout)
    if event is None:
        return {"config": config, "status": "timeout", "message": f"no result in {timeout:.0f} s"}
    result = event.result
    if result is None:
        return {"config": config, "status": event.kind, "message": event.message}
    row = result.to_dict()
    if isinstance(event, protocol.RunFailed):
        row["message"] = event.message
    return row


def summary(rows: list[dict], devices: int) -> list[dict]:
    """Per group row: tokens/s, scaling against the one-GPU row of the same compile mode, the
    peak of each rank, and the knobs that differ from the defaults (--knobs rows)."""
    def compiled(r):
        return r["config"].get("compile_mode", "off") != "off"

    out = []
    for i, group in enumerate(rows):
        c = group["config"]
        parallel = c.get("parallel", "none")
        if parallel == "none":
            continue
        # The latest one-GPU row of the same compile mode before this row (--fsdp-rounds pairs
        # each round's rows), else the first after it.
        ones = [(j, r) for j, r in enumerate(rows) if r["config"].get("parallel", "none") == "none"
                and compiled(r) == compiled(group)]
        before = [r for j, r in ones if j < i]
        one = before[-1] if before else (ones[0][1] if ones else None)
        ok = group.get("status") == "ok" and one and one.get("status") == "ok"
        size = c.get("devices", devices)
        out.append({
            "compile": compiled(group),
            "parallel": parallel,
            "knobs": knobs(c),
            "devices": size,
            "tokens_per_s": group.get("tokens_per_s"),
            "tokens_per_s_one_gpu": one.get("tokens_per_s") if one else None,
            "scaling": group["tokens_per_s"] / (size * one["tokens_per_s"]) if ok else None,
            # The scaling's relative spread: the two rows' step spreads combined; a difference
            # from a target smaller than this is a tie.
            "scaling_spread": noise.tie_gap(step_spread(group), step_spread(one)) if ok else None,
            "peak_gib_per_rank": [
                round(p["peak_memory_bytes"] / GIB, 2) if p.get("peak_memory_bytes") else None
                for p in group.get("per_rank", [])
            ],
            "peak_gib_one_gpu": round(one["peak_memory_bytes"] / GIB, 2)
            if one and one.get("peak_memory_bytes") else None,
            "status": group.get("status"),
        })
    return out


def step_spread(row: dict) -> float:
    """Half the interquartile range of a row's step times, relative to its median (0 if unknown)."""
    q1, q3, median = row.get("step_ms_q1"), row.get("step_ms_q3"), row.get("step_ms")
    return (q3 - q1) / 2 / median if q1 is not None and q3 is not None and median else 0.0


def knobs(config: dict) -> dict:
    """The data parallel knobs of `config` that are not at their defaults."""
    return {k: config[k] for k in KNOB_KEYS if config.get(k, OPTIONS[k].default) != OPTIONS[k].default}


def loss_agreement(rows: list[dict]) -> dict:
    """Largest relative difference between the DDP and FSDP2 losses of the same compile mode
    (the rows at default knobs)."""
    found = {}
    for compiled in (False, True):
        losses = {}
        for r in rows:
            c = r["config"]
            if knobs(c):
                continue
            if (c.get("compile_mode", "off") != "off") == compiled and r.get("losses"):
                losses[c.get("parallel", "none")] = r["losses"]
        if "ddp" in losses and "fsdp2" in losses:
            pairs = list(zip(losses["ddp"], losses["fsdp2"]))
            found["compile" if compiled else "eager"] = max(abs(a - b) / abs(a) for a, b in pairs)
    return found


def row_configs(args, gpu_count: int | None) -> tuple[list[dict], list[int]]:
    """The configurations to measure, in order, and the GPU counts of --ladder this machine
    lacks (`gpu_count`; None on the CPU, where gloo runs any number of processes)."""
    n, b = args.devices, args.per_gpu_batch
    one = {**BASE, **COMPILE, "batch_size": b}

    def group(k: int, extra: dict) -> dict:
        return {**BASE, **COMPILE, **extra, "devices": k, "batch_size": k * b}

    if args.ladder:
        sizes = [k for k in args.ladder if k > 1 and (gpu_count is None or k <= gpu_count)]
        lacking = [k for k in args.ladder if gpu_count is not None and k > gpu_count]
        return [one] + [group(k, {"parallel": mode, **extra})
                        for k in sizes for mode, extra in LADDER_KNOBS.items()], lacking
    if args.fsdp_rounds:
        # FSDP2's two no-reshard rows in rounds, each paired with its round's one-GPU row, so
        # that the rounds give the spread of the scaling.
        return [c for _ in range(args.fsdp_rounds) for c in [one] + [group(n, k) for k in KNOBS[:2]]], []
    configs = []
    for extra in ({}, COMPILE):
        configs.append({**BASE, **extra, "batch_size": b})
        for parallel in ("ddp", "fsdp2"):
            configs.append({**BASE, **extra, "parallel": parallel, "devices": n, "batch_size": n * b})
    if args.knobs:
        configs += [group(n, k) for k in KNOBS]
    return configs, []


def scaling_run(args) -> dict:
    n, b = args.devices, args.per_gpu_batch
    client, ready = start_worker(WorkerSpec(workload=args.workload, device=args.device))
    have = ready.environment.get("gpu_count") if args.device == "cuda" else None
    configs, not_run = row_configs(args, have)
    doc = {"tool": "benchmarks/parallel_scaling.py", "workload": ready.workload,
           "environment": ready.environment, "devices": n, "per_gpu_batch": b,
           "steps": args.steps, "warmup_steps": args.warmup, "rows": []}
    if not_run:
        doc["not_run"] = {"devices": not_run, "why": f"this machine has {have} GPUs"}
        print(f"not run: {', '.join(map(str, not_run))} GPUs (this machine has {have})", flush=True)
    try:
        for config in configs:
            started = time.monotonic()
            # --profile: a few more steps of each compiled row, after its measured ones, to see
            # what the collectives cost (the profile's communication share and verdict).
            profiled = args.profile and config.get("compile_mode", "off") != "off"
            row = run_trial(client, config, args.steps, args.warmup, args.trial_timeout,
                            profile_steps=3 if profiled else 0)
            row["wall_s"] = round(time.monotonic() - started, 1)
            doc["rows"].append(row)
            tps = row.get("tokens_per_s")
            print(f"{row.get('label', config)}: {row.get('status')} "
                  f"{tps and f'{tps / 1e3:.1f}k tokens/s'} {row.get('message', '')} "
                  f"({row['wall_s']} s)", flush=True)
            p = row.get("profile") or {}
            if p.get("categories"):
                shares = ", ".join(f"{k} {v:.0%}" for k, v in p["categories"].items() if v >= 0.01)
                print(f"  profile: {p.get('bottleneck')}: {p.get('evidence')}; {shares}", flush=True)
            doc["scaling"] = summary(doc["rows"], n)
            doc["ddp_vs_fsdp2_loss_rel_diff"] = loss_agreement(doc["rows"])
            write(args.json, doc)
            if not client.is_alive():
                client.stop()
                client, ready = start_worker(WorkerSpec(workload=args.workload, device=args.device))
    finally:
        client.stop()
    for s in doc["scaling"]:
        print(json.dumps(s))
    return doc


def rank_pids(worker_pid: int) -> list[int]:
    import psutil

    children = [c for c in psutil.Process(worker_pid).children()
                if "spawn_main" in " ".join(c.cmdline())]
    return [c.pid for c in sorted(children, key=lambda p: p.create_time())]


def faults_run(args) -> dict:
    import psutil

    n = args.devices
    workload = args.fault_workload
    doc = {"tool": "benchmarks/parallel_scaling.py --faults", "workload": workload}
    client, ready = start_worker(WorkerSpec(workload=workload, device=args.device))
    doc["environment"] = ready.environment
    try:
        config = {**BASE, "parallel": "ddp", "devices": n}
        client.send(protocol.ApplyConfig(TuneConfig.from_dict(config), measure_steps=10_000))
        for _ in range(10):
            wait_for(client, (protocol.StepMeasured,), 300)
        ranks = rank_pids(client.pid)
        killed_at = time.monotonic()
        os.kill(ranks[-1], signal.SIGKILL)
        failed = wait_for(client, (protocol.RunFailed,), 60)
        noticed = time.monotonic() - killed_at
        left = [p for p in ranks if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        client.send(protocol.ApplyConfig(TuneConfig.from_dict(config), measure_steps=10_000))
        step = wait_for(client, (protocol.StepMeasured,), 300)
        doc["kill"] = {
            "killed_rank": len(ranks) - 1, "message": failed.message if failed else None,
            "noticed_s": round(noticed, 2), "ranks_left_running": left,
            "new_group_first_step_s": round(time.monotonic() - killed_at, 2) if step else None,
            "new_group_ranks": rank_pids(client.pid),
        }
        print(json.dumps(doc["kill"]), flush=True)
        if args.device != "cuda":  # the CPU would swap, not fail
            return doc
        # A real OOM: fp32 with the manual attention, which keeps every head's 1024 x 1024
        # scores and probabilities (at least 1.2 GB a sequence on GPT-2 124M). 64 per GPU ran
        # on the H200 (so more than 76 GB), hence 128 per GPU need more than 152. The worker's
        # fp32 reference for the global batch uses SDPA and its fallbacks; at 512 sequences
        # (bf16 at 256 per GPU) it had taken more than 170 s before the group even started.
        big = {**config, "precision": "fp32", "attention": "manual",
               "batch_size": n * args.oom_batch_per_gpu}
        client.send(protocol.ApplyConfig(TuneConfig.from_dict(big), measure_steps=5))
        started = time.monotonic()
        failed = wait_for(client, (protocol.RunFailed, protocol.TrialFinished), 300)
        finished = isinstance(failed, protocol.TrialFinished)
        doc["oom"] = {"kind": "no out of memory: the run fitted" if finished
                      else getattr(failed, "kind", None),
                      "message": getattr(failed, "message", None),
                      "peak_gib_per_rank": [round((p.get("peak_memory_bytes") or 0) / GIB, 1)
                                            for p in failed.result.to_dict().get("per_rank", [])]
                      if finished else None,
                      "seconds": round(time.monotonic() - started, 2),
                      "ranks_after": rank_pids(client.pid)}
        print(json.dumps(doc["oom"]), flush=True)
    finally:
        client.stop()
        write(args.json, doc)
    return doc


def plot(paths: list[str], out: str) -> None:
    """An SVG of scaling against GPUs (log scale), one line per workload and mode, from the
    --ladder (or any scaling) result files, with the 0.9 asked at 8 GPUs drawn dashed."""
    lines = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        name = doc["workload"]["name"]
        for row in summary(doc["rows"], doc["devices"]):
            if row["scaling"] is not None and row["compile"]:
                points = lines.setdefault(f"{name} {row['parallel']}", {1: 1.0})
                points[row["devices"]] = row["scaling"]
    width, height, left, bottom, top = 560, 320, 60, 40, 20
    sizes = sorted({k for pts in lines.values() for k in pts} | {1, 2})
    span = max(1.0, math.log2(sizes[-1]))
    low = min([0.5] + [v for pts in lines.values() for v in pts.values()]) - 0.05

    def xy(k, v):
        x = left + (width - left - 20) * math.log2(k) / span
        y = top + (height - top - bottom) * (1.05 - v) / (1.05 - low)
        return round(x, 1), round(y, 1)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for v in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        if low <= v:
            x0, y = xy(1, v)
            svg.append(f'<line x1="{x0}" y1="{y}" x2="{width - 20}" y2="{y}" stroke="#ddd"/>')
            svg.append(f'<text x="{x0 - 8}" y="{y + 4}" text-anchor="end">{v:.2f}</text>')
    x0, y9 = xy(1, 0.9)
    svg.append(f'<line x1="{x0}" y1="{y9}" x2="{width - 20}" y2="{y9}" stroke="#888" '
               'stroke-dasharray="5,4"/>')
    for k in sizes:
        x, y = xy(k, low)
        svg.append(f'<text x="{x}" y="{y + 18}" text-anchor="middle">{k}</text>')
    svg.append(f'<text x="{width / 2}" y="{height - 4}" text-anchor="middle">GPUs</text>')
    svg.append(f'<text x="14" y="{top + 4}">scaling</text>')
    for i, (label, pts) in enumerate(sorted(lines.items())):
        color = colors[i % len(colors)]
        coords = " ".join(f"{x},{y}" for x, y in (xy(k, v) for k, v in sorted(pts.items())))
        svg.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for k, v in sorted(pts.items()):
            x, y = xy(k, v)
            svg.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>')
        svg.append(f'<text x="{left + 10}" y="{height - bottom - 10 - 16 * i}" fill="{color}">'
                   f'{label}</text>')
    svg.append("</svg>")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(svg) + "\n")


def write(path: str | None, doc: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def gpu_counts(text: str) -> list[int]:
    """--ladder's value: GPU counts such as 1,2,4,8."""
    try:
        counts = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: GPU counts separated by commas, e.g. 1,2,4,8") from None
    if counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: GPU counts of at least 1, e.g. 1,2,4,8")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="llama-1b")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--per-gpu-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trial-timeout", type=float, default=300.0)
    parser.add_argument("--json")
    rows = parser.add_mutually_exclusive_group()  # which rows: one of these, or the default
    rows.add_argument("--knobs", action="store_true",
                        help="also the compiled groups with FSDP2 not resharding and DDP's larger "
                             "bucket views")
    rows.add_argument("--fsdp-rounds", type=int, default=0, metavar="N",
                        help="only the compiled one GPU and FSDP2 without resharding (fp32, then "
                             "bf16 gradient reduce), N rounds: the spread of the best scaling")
    rows.add_argument("--ladder", type=gpu_counts,
                        metavar="N1,N2,...", help="the compiled rows at each number of GPUs "
                        "(e.g. 1,2,4,8; those the machine lacks are listed as not run)")
    parser.add_argument("--plot", nargs="+", metavar="JSON",
                        help="draw scaling against GPUs from result files into --svg (no run)")
    parser.add_argument("--svg", default="scaling.svg", help="where --plot writes")
    parser.add_argument("--profile", action="store_true",
                        help="profile each compiled row after its measured steps")
    parser.add_argument("--faults", action="store_true", help="the fault checks instead")
    parser.add_argument("--fault-workload", default="gpt2-124m")
    parser.add_argument("--oom-batch-per-gpu", type=int, default=128)
    parser.add_argument("--summarize", metavar="JSON",
                        help="print the scaling summary of a committed result file (no run)")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.svg)
        print(f"wrote {args.svg}")
        return 0
    if args.summarize:
        doc = json.loads(Path(args.summarize).read_text())
        for row in summary(doc["rows"], doc["devices"]):
            print(json.dumps(row))
        return 0
    doc = faults_run(args) if args.faults else scaling_run(args)
    return 0 if doc else 1


if __name__ == "__main__":
    sys.exit(main())

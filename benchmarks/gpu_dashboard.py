"""The dashboard on the GPU machine, headless, on the real worker: the throughput it measures for a
configuration (to set beside `gputune bench` for the same one), a screenshot, a real CUDA OOM and
a real SIGKILL of the worker during a run. Writes one JSON file with what happened.

    python benchmarks/gpu_dashboard.py --config best.toml --svg dashboard.svg --json dashboard.json

Steps, each checked and recorded (a failed check is recorded, not raised, so the file always
says how far it got):
1. the baseline row, then the given configuration's row (its tokens/s is the dashboard figure);
2. a screenshot after some seconds of training;
3. the same configuration at a batch far too large: the row must say OOM with the memory asked
   for, the worker must live on, and the GPU memory in use (NVML) must come back down;
4. the configuration again; SIGKILL the worker while it measures: the dashboard must notice
   within 2 s, start a new worker that re-applies it, and keep every row;
5. quit: no process of ours may be left.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil

import strategies
from tuner_tui.app.app import GputuneApp
from tuner_tui.engine.client import WorkerClient
from tuner_tui.engine.protocol import WorkerSpec

OOM_BATCH = 2048
"""gpt2-124m at 2048 x 1024 tokens: the bf16 logits alone are over 200 GB."""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def gpu_memory_used(app: GputuneApp) -> int | None:
    sample = app.gpu_panel.sample
    gpus = getattr(sample, "gpus", None) or ()
    return gpus[0].memory_used_bytes if gpus else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="an exported configuration")
    parser.add_argument("--workload", default="gpt2-124m")
    parser.add_argument("--svg", default="dashboard.svg")
    parser.add_argument("--json", default="dashboard.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--oom-batch", type=int, default=OOM_BATCH)
    parser.add_argument("--fault", help="worker fault injection, for a dry run on the CPU "
                        "(e.g. oom-above:64); the GPU run provokes a real OOM")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per step above")
    args = parser.parse_args()
    config = strategies.load(args.config)
    spec = WorkerSpec(workload=args.workload, device=args.device, fault_injection=args.fault)
    app = GputuneApp(lambda: WorkerClient(spec), subtitle=f"{spec.workload} · {args.device}")
    record: dict = {"config": config.to_dict(), "checks": {}, "rows": []}
    checks = record["checks"]
    pids: set[int] = set()

    async def wait(pilot, predicate, what: str) -> bool:
        deadline = time.monotonic() + args.timeout
        while not predicate():
            if time.monotonic() > deadline:
                checks[what] = f"timed out after {args.timeout:.0f} s"
                return False
            await pilot.pause(0.1)
        return True

    async def drive(pilot) -> None:
        try:
            await steps(pilot)
        finally:
            record["rows"] = [dict(r.result.to_dict(), number=r.number) for r in app.session.rows]
            record["environment"] = app.session.environment
            await app.action_quit()

    async def steps(pilot) -> None:
        # 1. baseline, then the configuration
        if not await wait(pilot, lambda: len(app.session.rows) >= 1, "baseline row"):
            return
        pids.add(app.session.worker_pid)
        app.apply_in_turn([config])
        if not await wait(pilot, lambda: len(app.session.rows) >= 2, "configuration row"):
            return
        row = app.session.rows[1].result
        record["dashboard"] = {"label": row.label, "status": row.status,
                               "tokens_per_s": row.tokens_per_s, "step_ms": row.step_ms}
        # 2. screenshot after some training, with the plots filled
        await pilot.pause(6.0)
        app.clear_notifications()
        await pilot.pause(0.5)
        Path(args.svg).write_text(app.export_screenshot(title="gputune"))

        # 3. a real OOM
        before = gpu_memory_used(app)
        measured_rows = [r.result for r in app.session.rows]
        oom = config.replace(batch_size=args.oom_batch, compile_mode="off", fused_kernels=(),
                             checkpointing="off")
        app.apply_in_turn([oom])
        if not await wait(pilot, lambda: len(app.session.rows) >= 3, "oom row"):
            return
        oom_row = app.session.rows[2].result
        await pilot.pause(3.0)  # a few telemetry samples after the OOM
        after = gpu_memory_used(app)
        checks["oom_row_says_oom"] = oom_row.status == "oom"
        checks["earlier_rows_unchanged"] = [r.result for r in app.session.rows[:2]] == measured_rows
        checks["oom_message"] = oom_row.message
        checks["oom_worker_lives_on"] = app.reader._source.is_alive()
        checks["gpu_memory_used_before_oom"] = before
        checks["gpu_memory_used_after_oom"] = after

        # 4. the configuration again; kill the worker while it measures
        run_before = app.session.run_id
        app.apply_in_turn([config])
        # Kill it mid-run: once the new run has measured a few steps past its compile.
        if not await wait(pilot, lambda: app.session.run_id != run_before
                          and app.session.last_step is not None
                          and app.session.last_step.run_id == app.session.run_id
                          and app.session.last_step.step >= 3, "training again"):
            return
        old = app.session.worker_pid
        crashes_before = sum(r.result.status == "crash" for r in app.session.rows)
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        # Noticed: the run in flight has its crash row (the user sees it and a notification).
        if not await wait(pilot, lambda: sum(r.result.status == "crash" for r in app.session.rows)
                          > crashes_before, "crash row"):
            return
        checks["kill_noticed_s"] = round(time.monotonic() - killed, 3)
        # Replaced: a new worker process is up (it then re-applies the configuration).
        if not await wait(pilot, lambda: app.session.worker_pid not in (None, old), "new worker"):
            return
        checks["kill_noticed_and_replaced_s"] = round(time.monotonic() - killed, 3)
        pids.add(app.session.worker_pid)
        rows_at_kill = len(app.session.rows)
        if not await wait(pilot, lambda: len(app.session.rows) > rows_at_kill
                          and app.session.rows[-1].result.status == "ok", "row after restart"):
            return
        checks["rows_kept"] = [r.result.status for r in app.session.rows]
        checks["reapplied_after_kill"] = app.session.rows[-1].result.config == config.to_dict()
        pids.add(app.session.worker_pid)

    app.run(headless=True, size=(160, 50), auto_pilot=drive)
    if app.reader is not None:
        app.reader.close()
    deadline = time.monotonic() + 15
    while not all(gone(p) for p in pids if p) and time.monotonic() < deadline:
        time.sleep(0.2)
    checks["no_process_left"] = all(gone(p) for p in pids if p)
    Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(json.dumps({"dashboard": record.get("dashboard"), "checks": checks}, indent=2,
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

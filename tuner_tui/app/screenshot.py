"""Run the dashboard headless on the real worker, apply a list of configurations, then save an SVG
screenshot and the leaderboard as JSON. For the README's screenshot and for measuring the
throughput with the dashboard attached (against `gputune bench`).

    python -m tuner_tui.app.screenshot --out dashboard.svg --json rows.json \\
        --set precision=bf16 --set precision=bf16,compile_mode=default
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from strategies.config import ConfigError, TuneConfig
from strategies.files import write_atomic
from strategies.registry import OPTIONS


def parse_config(text: str) -> TuneConfig:
    """`precision=bf16,compile_mode=default` (a set option takes `a+b`)."""
    values = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, raw = part.partition("=")
        if key not in OPTIONS:
            raise ConfigError(f"unknown option {key!r}: allowed options are " + ", ".join(OPTIONS))
        values[key] = OPTIONS[key].parse_one_of_several(raw)
    return TuneConfig.from_dict(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner_tui.app.screenshot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--set", dest="configs", action="append", default=[], metavar="K=V,...",
                        help="a configuration to apply after the baseline (repeatable)")
    parser.add_argument("--after", type=float, default=5.0, help="seconds to train on after the last row")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--size", default="160x50", help="terminal size, WxH")
    parser.add_argument("--out", default="dashboard.svg")
    parser.add_argument("--json", metavar="FILE", help="write the leaderboard rows (TrialResult dicts)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the last row (key x) and show its panel in the screenshot")
    parser.add_argument("--max-memory", metavar="SIZE",
                        help="the memory budget the memory panel shows, e.g. 2GiB")
    args = parser.parse_args(argv)
    from tuner_tui.engine.search import parse_bytes

    try:
        configs = [parse_config(c) for c in args.configs]
        budget = parse_bytes(args.max_memory) if args.max_memory else None
    except (ConfigError, ValueError) as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 2
    width, _, height = args.size.partition("x")

    from tuner_tui.app.app import GputuneApp
    from tuner_tui.engine.client import WorkerClient
    from tuner_tui.engine.protocol import WorkerSpec

    from tuner_tui.engine.worker_log import new_run_log

    spec = WorkerSpec(workload=args.workload, device=args.device,
                      log_path=str(new_run_log("screenshot")))
    app = GputuneApp(lambda: WorkerClient(spec), subtitle=f"{spec.workload} · {spec.device}",
                     memory_budget=budget, log_path=spec.log_path)
    wanted = 1 + len(configs)
    outcome = {"code": 0}

    async def drive(pilot) -> None:
        deadline = time.monotonic() + args.timeout
        while app.session.capabilities is None and time.monotonic() < deadline:
            await pilot.pause(0.5)
        app.apply_in_turn(configs)
        while len(app.session.rows) < wanted and time.monotonic() < deadline:
            await pilot.pause(0.5)
        if len(app.session.rows) < wanted:
            print(f"screenshot: only {len(app.session.rows)} of {wanted} rows within {args.timeout:.0f}s", file=sys.stderr)
            outcome["code"] = 1
        if args.profile and outcome["code"] == 0:
            app.action_profile()
            while not app.session.profiled and time.monotonic() < deadline:
                await pilot.pause(0.5)
        await pilot.pause(args.after)
        app.clear_notifications()
        await pilot.pause(0.5)
        write_atomic(args.out, app.export_screenshot(title="gputune"))
        if args.json:
            rows = [dict(r.result.to_dict(), number=r.number) for r in app.session.rows]
            write_atomic(args.json, json.dumps({"environment": app.session.environment, "rows": rows}, indent=2) + "\n")
        await app.action_quit()

    app.run(headless=True, size=(int(width), int(height)), auto_pilot=drive)
    if app.reader is not None:
        app.reader.close()
    print(f"wrote {args.out}" + (f" and {args.json}" if args.json else ""))
    return outcome["code"]


if __name__ == "__main__":
    sys.exit(main())

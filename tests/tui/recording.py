"""Worker events to and from JSON, to record a real run once and replay it in tests.

Record (writes tests/tui/data/recorded_run.json; takes about a minute on the CPU):

    python tests/tui/recording.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from strategies.config import TuneConfig
from tuner_tui.engine import protocol

DATA = Path(__file__).parent / "data" / "recorded_run.json"
EVENT_TYPES = {
    cls.__name__: cls
    for cls in (
        protocol.WorkerReady, protocol.RunStarted, protocol.CompileStarted, protocol.CompileFinished,
        protocol.StepMeasured, protocol.TrialFinished, protocol.RunFailed, protocol.Paused,
        protocol.Resumed, protocol.WorkerLog, protocol.ProfileMeasured,
    )
}


def encode(event) -> dict:
    fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    if isinstance(fields.get("result"), protocol.TrialResult):
        fields["result"] = fields["result"].to_dict()
    if isinstance(fields.get("config"), TuneConfig):
        fields["config"] = fields["config"].to_dict()
    return {"type": type(event).__name__, "fields": fields}


def decode(item: dict):
    cls = EVENT_TYPES[item["type"]]
    fields = dict(item["fields"])
    known = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in fields.items() if k in known}
    if isinstance(fields.get("result"), dict):
        fields["result"] = protocol.TrialResult.from_dict(fields["result"])
    if cls is protocol.RunStarted:
        fields["config"] = TuneConfig.from_dict(fields["config"])
    return cls(**fields)


def load_recording(path: Path = DATA) -> list:
    return [decode(item) for item in json.loads(path.read_text())]


def record(configs: list[TuneConfig], steps_after_trial: int = 10) -> list:
    """Drive a real CPU worker through `configs`; each run until its TrialFinished (or failure)
    and `steps_after_trial` more steps."""
    from tuner_tui.engine.client import WorkerClient
    from tuner_tui.engine.protocol import WorkerSpec

    client = WorkerClient(WorkerSpec(workload="gpt2-tiny", device="cpu"))
    client.start()
    events = []
    try:
        ready = client.wait_event(120)
        assert isinstance(ready, protocol.WorkerReady), ready
        events.append(ready)
        for config in configs:
            client.send(protocol.ApplyConfig(config))
            after = None
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                event = client.wait_event(5)
                if event is None:
                    continue
                events.append(event)
                if isinstance(event, protocol.RunFailed):
                    break
                if isinstance(event, protocol.TrialFinished):
                    after = 0
                elif isinstance(event, protocol.StepMeasured) and after is not None:
                    after += 1
                    if after >= steps_after_trial:
                        break
    finally:
        client.stop()
    return events


def main() -> int:
    base = TuneConfig()
    configs = [
        base,
        base.replace(precision="bf16"),
        base.replace(precision="bf16", attention="sdpa", optimizer="foreach"),
        base.replace(attention="sdpa", compile_mode="default"),
        base.replace(checkpointing="full", attention="sdpa"),
    ]
    events = record(configs)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps([encode(e) for e in events], indent=None) + "\n")
    print(f"wrote {len(events)} events to {DATA}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recorded profiler activities for the tests of `engine/profile.py`: a real CPU profile of a
workload, stored as rows of `Activity` fields (gzipped JSON).

    PYTHONPATH=.:tests/engine python tests/engine/profile_recording.py user_workloads:many_tiny_ops \
        tests/engine/data/profile-many-tiny-ops-cpu.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from tuner_tui.engine.profile import Activity

DATA = Path(__file__).parent / "data"
HOST_BOUND_CPU = DATA / "profile-many-tiny-ops-cpu.json.gz"


def load(path: Path = HOST_BOUND_CPU) -> tuple[list[Activity], dict]:
    """(activities, facts): facts holds the device and the run's measured step time."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return [Activity.from_row(r) for r in doc["activities"]], doc["facts"]


def record(workload: str, path: str, steps: int = 1) -> None:
    from strategies.config import TuneConfig
    from tuner_tui.engine import workloads
    from tuner_tui.engine.profiler import capture
    from tuner_tui.engine.trial import Trainer

    trainer = Trainer(workloads.load(workload, None, 0, None, "cpu"), TuneConfig(), "cpu",
                      warmup_steps=3)
    trainer.build()
    for _ in range(8):
        trainer.step()
    trainer.finish()
    measured = trainer.result().step_ms
    activities = capture(trainer, steps)
    doc = {"facts": {"device": "cpu", "workload": workload, "measured_step_ms": measured},
           "activities": [a.to_row() for a in activities]}
    Path(path).write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode()))


if __name__ == "__main__":
    record(sys.argv[1], sys.argv[2])

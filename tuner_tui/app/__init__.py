"""The Textual dashboard. Imports no torch: it talks to the worker through the protocol only.

`run_dashboard(spec, start_config)` is what `gputune` (no subcommand) calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.config import TuneConfig
    from tuner_tui.engine.protocol import WorkerSpec


def run_dashboard(spec: "WorkerSpec", start_config: "TuneConfig | None" = None,
                  memory_budget: int | None = None) -> int:
    from tuner_tui.app.run import run_dashboard as _run

    return _run(spec, start_config, memory_budget)


__all__ = ["run_dashboard"]

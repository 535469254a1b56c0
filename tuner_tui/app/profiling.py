"""Asking the worker for a profile (key x): of the selected leaderboard row, applied again
unless it is the current run, or of the current run. The worker takes it after the run's
measured steps and answers with `ProfileMeasured`, which the profile panel shows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from strategies.config import ConfigError
from tuner_tui.engine import protocol

TRACE_DIR = "gputune-traces"
"""Where the dashboard writes traces (key X), under the current directory."""


def shown(app: Any) -> bool:
    return app.profile_shown


def set_shown(app: Any, shown: bool) -> None:
    """The profile panel in the plots' place (in the compact layout: its view), or back."""
    app.profile_shown = shown


def request_profile(app: Any, trace: bool) -> None:
    """`app`: the running `GputuneApp`."""
    session = app.session
    if session.capabilities is None or app.reader is None:
        app.notify("The worker is not ready yet.", severity="warning")
        return
    row = app.chosen_row()
    target = row or session.row_for_run(session.run_id)
    panel = app.profile_panel
    if shown(app) and target is not None and panel.number == target.number:
        set_shown(app, False)  # x again on the row shown: back to its configuration
        return
    if row is not None and row is not session.row_for_run(session.run_id):
        try:
            config = row.result.tune_config
        except ConfigError as exc:
            app.notify(str(exc), title="cannot profile", severity="error")
            return
        app.toggles.set_config(config, applied=False)
        app.controller.stop_search("stopped: a row is profiled")
        app.controller.queue.clear()
        if not app.controller.apply(config):
            return
        what = f"run {row.number} ({row.result.label}), applied again"
    else:
        what = f"the current run ({session.run_label or 'starting'})"
    path = None
    if trace:
        path = str((Path(TRACE_DIR) / time.strftime("profile-%Y%m%d-%H%M%S.json")).resolve())
    if not app.reader.send(protocol.ProfileRun(trace_path=path)):
        app.notify("No worker to profile with.", severity="warning")
        return
    session.profile_note = f"profiling {what} after its measured steps…"
    set_shown(app, True)
    app.show_selected_row()
    # The panel says it; no notice over the leaderboard.
    session.log("info", session.profile_note + (f" trace: {path}" if path else ""))


def show_profile(app: Any, row: Any) -> None:
    """The profile of `row` (a session `Row`), or if it has none, the last one taken."""
    if row is None or not row.result.profile:
        row = app.session.last_profiled()
    if row is not None:
        app.profile_panel.show(row.number, row.result.label, row.result.profile)
    else:
        app.profile_panel.show(None, "", None, app.session.profile_note)


def profile_arrived(app: Any, event: protocol.ProfileMeasured) -> None:
    profile = event.profile
    if profile.get("categories"):
        app.session.log("info", f"profiled: {profile['bottleneck']}-bound: {profile['evidence']}")
    set_shown(app, True)
    show_profile(app, app.session.row_for_run(event.run_id))

"""The command palette's entries (ctrl+p): every action of the dashboard by name."""

from __future__ import annotations

from typing import Any, Iterable

from textual.app import SystemCommand


def palette_commands(app: Any) -> Iterable[SystemCommand]:
    """`app`: the running `GputuneApp`."""
    yield SystemCommand("Apply options", "Send the options panel's configuration to the worker", app.action_apply)
    yield SystemCommand("Pause / resume training", "Pause the worker, or resume it", app.action_toggle_pause)
    yield SystemCommand("Re-apply selected row", "Apply the configuration of the selected leaderboard row", app.action_reapply)
    yield SystemCommand("Export configuration", "Write the selected row (else the best) to TOML or JSON", app.action_export)
    yield SystemCommand("Sort leaderboard", "Sort by the next column: #, tokens/s, step ms, memory, compile", app.action_sort)
    yield SystemCommand("Apply baseline", "Apply the default configuration (fp32, eager)", app.action_baseline)
    yield SystemCommand("Restart worker", "Stop the worker process and start a new one", app.action_restart_worker)
    yield SystemCommand("Search", "Start (or stop) the automatic search: gputune tune's search, trial by trial on this run", app.action_search)
    yield SystemCommand("History", "Configurations measured before on this machine (result store)", app.action_history)
    yield SystemCommand("Profile", "Where the step's time goes in the selected row (or the current run), and what to try", app.action_profile)
    yield SystemCommand("Profile and write a trace", "The profile, and its Chrome/Perfetto trace under gputune-traces/", lambda: app.action_profile(True))
    yield SystemCommand("Log", "Warnings of the worker and of torch, torchao, triton, transformers", app.action_log)
    yield SystemCommand("Next view", "On a small terminal: the next view beside the figures", app.action_next_view)
    yield SystemCommand("Help", "What the panels show and the keys", app.action_help)
    yield SystemCommand("Quit gputune", "Stop the worker and exit", app.action_quit)

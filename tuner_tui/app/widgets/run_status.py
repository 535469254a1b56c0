"""One line: what the worker is doing (running, compiling… Ns, paused, dead) and on what."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from tuner_tui.app.session import Session

STATE_LOOK = {
    "starting": ("◌", "starting worker…", "yellow"),
    "ready": ("○", "ready", "cyan"),
    "applying": ("◌", "preparing", "yellow"),
    "running": ("●", "training", "green"),
    "compiling": ("◐", "compiling…", "bold yellow"),
    "paused": ("⏸", "paused", "yellow"),
    "idle": ("○", "idle: the last run failed (a applies the options, r re-applies a row)", "red"),
    "dead": ("✖", "worker died", "bold red"),
    "stopped": ("■", "stopped", "dim"),
}


def status_text(session: Session, now: float) -> Text:
    glyph, words, style = STATE_LOOK.get(session.worker_state, ("?", session.worker_state, ""))
    text = Text(no_wrap=True, overflow="ellipsis")
    compiling = session.compiling_for(now)
    first_step = session.first_step_for(now)
    preparing = session.preparing_for(now)
    measuring = session.measuring()
    if compiling is not None:
        words = f"building {session.compile_what or 'torch.compile'}… {compiling:.0f}s"
    elif first_step is not None:
        words = f"first step… {first_step:.0f}s"
    elif preparing is not None:
        words = f"preparing… {preparing:.0f}s"
    elif measuring is not None and session.worker_state == "running":
        done, cap = measuring
        words = (f"measuring {done}/{session.measure_steps}" if done <= session.measure_steps
                 else f"measuring {done} (noisy, up to {cap})")
    text.append(f"{glyph} {words}", style=style)
    warnings = session.warnings_logged()
    if warnings:
        text.append(f"  ⚠ {warnings} in log (l)", style="yellow")
    if session.worker_state == "applying":
        text.append(f" {session.worker_note}", style="bold yellow")
        if session.preparing_note:
            text.append(f": {session.preparing_note}", style="yellow")
        if session.search_note:
            text.append(f"   ⟳ {session.search_note}", style="bold magenta")
        return text
    if session.worker_state == "dead" and session.worker_note:
        text.append(f"  {session.worker_note}", style="red")
    if session.run_id is not None:
        text.append(f"   run {session.run_number}: ", style="dim")
        text.append(session.run_label, style="bold")
    if session.search_note:
        text.append(f"   ⟳ {session.search_note}", style="bold magenta")
    workload = session.workload.get("name")
    if workload:
        device = (session.capabilities.device if session.capabilities else "") or ""
        gpu = session.capabilities.gpu_name if session.capabilities else ""
        where = f"{device} ({gpu})" if gpu else device
        text.append(f"   {workload} on {where}", style="dim")
    if session.worker_pid:
        text.append(f"   pid {session.worker_pid}", style="dim")
    return text


class RunStatus(Static):
    DEFAULT_CSS = """
    RunStatus {
        height: 1;
        padding: 0 1;
    }
    """

    def show(self, session: Session, now: float | None = None) -> None:
        self.update(status_text(session, time.monotonic() if now is None else now))

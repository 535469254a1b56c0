"""The progress line of bench and tune: a bar and the time left on a terminal, one line per
state change in a log."""

import io

from tuner_tui.engine import progress as progress_module
from tuner_tui.engine.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_state_and_the_summary():
    out = io.StringIO()
    p = Progress(out)
    p.begin(1, 3, "fp32")
    p.set("measuring", "1/20")
    p.set("measuring", "2/20")
    p.end("1.2k tokens/s")
    assert out.getvalue().splitlines() == [
        "[1/3] fp32: starting worker", "[1/3] fp32: measuring", "[1/3] fp32: 1.2k tokens/s"]


def test_a_terminal_gets_a_bar_and_the_time_left_from_the_trials_done(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    p = Progress(Terminal())
    p.begin(1, "~4", "fp32")
    p.set("measuring", "10/20")
    assert p.fraction() == 0.125 and p.time_left() is None  # nothing finished yet
    clock[0] += 30.0
    p.end("done")
    p.begin(2, "~4", "bf16 + sdpa + compile(default) + fused AdamW")
    clock[0] += 10.0
    p.set("compiling")
    assert p.time_left() == 20.0 + 2 * 30.0
    line = p.line(80)
    assert "ETA 1m20s" in line and "━" in line and " 33%" in line
    assert len(line) - line.count("\x1b") * 4 < 90  # cut to the width, less the colour codes
    assert "…" in p.line(60) and "ETA" in p.line(60)
    p.begin(3, 4, "fp16", eta_s=50.0)
    clock[0] += 5.0
    assert p.time_left() == 45.0

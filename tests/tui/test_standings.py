"""Which row leads: a best only when its lead is larger than the combined spread, else a tie won
by the simpler configuration."""

from __future__ import annotations

from strategies.config import TuneConfig
from tuner_tui.app.session import Row
from tuner_tui.app.standings import standing
from tuner_tui.engine import protocol


def row(number: int, tokens: float, spread: float = 0.01, status: str = "ok", loss_ok=True,
        **config) -> Row:
    step = 1e6 / tokens
    result = protocol.TrialResult(
        config=TuneConfig().replace(**config).to_dict(), label=TuneConfig().replace(**config).label(),
        status=status, tokens_per_s=tokens, step_ms=step, step_ms_q1=step * (1 - spread),
        step_ms_q3=step * (1 + spread), loss_ok=loss_ok, peak_memory_bytes=1 << 20)
    return Row(number, (1, number), result)


def test_a_lead_beyond_the_spread_is_the_best():
    base, fast = row(1, 1000.0), row(2, 1500.0, precision="bf16")
    s = standing([base, fast])
    assert s.best is fast and s.pick is fast and not s.is_tie()
    assert s.text() == "best: #2 1.5k tokens/s, 50% ahead of #1 (spread ±1.4%)"
    assert s.mark(fast) == "★" and s.mark(base) == ""


def test_the_issues_noisy_case_is_a_tie_won_by_the_simpler():
    # The baseline's spread at ±68%: "fp32 + bf16 state 13.3k ×14.52" was announced as best.
    base = row(1, 916.0, spread=0.68)
    state = row(2, 13_300.0, spread=0.05, optimizer_state="bf16")
    other = row(3, 12_900.0, spread=0.04, precision="bf16", optimizer_state="bf16")
    s = standing([base, state, other])
    assert s.best is None and s.is_tie() and [r.number for r in s.tied] == [2, 3]
    assert s.pick is state  # fewer options changed
    assert s.text().startswith("tie: #2, #3 within the spread") and s.text().endswith("is #2")
    assert s.mark(state) == s.mark(other) == "=" and s.mark(base) == ""


def test_failed_and_off_reference_rows_never_lead_and_one_row_is_no_ranking():
    base = row(1, 1000.0)
    s = standing([base, row(2, 9000.0, status="oom"), row(3, 5000.0, loss_ok=False),
                  row(4, 8000.0, status="numerics")])
    assert s.pick is base and s.best is None and s.text() == "" and s.count == 1
    assert standing([]).pick is None and standing([]).text() == ""

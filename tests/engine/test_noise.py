"""Noise: every row's spread, noisy rows said in words, leaders re-measured interleaved, ties won
by the simpler configuration."""

import json

import pytest

from tuner_tui.engine import noise, remeasure
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.table import format_table


def row(label, tokens, spread=0.01, config=None, peak=None, status="ok"):
    """A result whose step times have the given relative half-IQR around 10 ms."""
    step = 10.0 * 1000.0 / tokens
    return TrialResult(config=config if config is not None else {}, label=label, status=status,
                       tokens_per_s=tokens, step_ms=step, step_ms_q1=step * (1 - spread),
                       step_ms_q3=step * (1 + spread), peak_memory_bytes=peak)


def test_quartiles_and_spread_of_measured_steps():
    assert noise.quartiles([10.0]) == (10.0, 10.0)
    assert noise.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    r = row("a", 1000.0, spread=0.02)
    assert noise.spread(r) == pytest.approx(0.02) and noise.spread_text(r) == "±2.0%"
    assert noise.spread(TrialResult(config={}, label="x", status="oom")) is None


def test_a_noisy_row_is_said_in_words_in_the_table_and_the_report():
    quiet, busy = row("fp32", 1000.0, 0.01), row("bf16", 2000.0, 0.12)
    assert not noise.is_noisy(quiet) and noise.is_noisy(busy)
    assert noise.noise_warning(busy) == ("noisy: steps varied by ±12.0%; a busy host or thermal "
                                         "throttling?")
    table = format_table([quiet, busy])
    assert "spread" in table.splitlines()[0] and "±1.0%" in table and "±12.0%!" in table
    assert noise.noise_lines([quiet, busy]) == [f"row 2 (bf16): {noise.noise_warning(busy)}"]


def test_leaders_are_the_rows_within_a_few_spreads_of_the_best():
    best = row("a", 1000.0, 0.01)
    close = row("b", 980.0, 0.01)
    far = row("c", 700.0, 0.01)
    wide = row("d", 900.0, 0.05)  # 10% behind, but its spread is ±5%
    assert remeasure.leaders([far, close, best]) == [best, close]
    assert remeasure.leaders([best, wide]) == [best, wide]
    assert remeasure.leaders([best, far]) == [best]
    assert remeasure.leaders([best, close, wide, row("e", 990.0)], limit=2) == [best, row("e", 990.0)]


def _candidate(original, *tokens, spread=0.01):
    return remeasure.Remeasured(original, [row(original.label, t, spread) for t in tokens])


def test_a_difference_within_the_spread_is_a_tie_won_by_the_simpler_configuration():
    simple = row("fp32 + sdpa", 500_000.0, config={"attention": "sdpa"}, peak=2)
    complex_ = row("bf16 + sdpa + compile", 504_000.0,
                   config={"attention": "sdpa", "precision": "bf16", "compile_mode": "default"},
                   peak=1)
    verdict = remeasure.decide([_candidate(complex_, 504_000.0, 504_000.0),
                                _candidate(simple, 498_000.0, 498_000.0)])
    assert verdict.tie and verdict.winner is simple
    assert verdict.text() == (
        "re-measured interleaved (2 more runs each, the first counted): bf16 + sdpa + compile "
        "504.0k ±1.0%, fp32 + sdpa 498.0k ±1.0%: tie, fp32 + sdpa wins as the simpler "
        "configuration")
    # The same options changed: less peak memory wins the tie.
    a = row("a", 1000.0, config={"attention": "sdpa"}, peak=200)
    b = row("b", 1000.0, config={"optimizer": "foreach"}, peak=100)
    assert remeasure.decide([_candidate(a, 1001.0, 1001.0), _candidate(b, 999.0, 999.0)]).winner is b


def test_a_difference_beyond_the_spread_names_the_faster_and_a_failed_repeat_drops_out():
    fast = row("bf16", 600.0, config={"precision": "bf16"})
    slow = row("fp32", 500.0)
    verdict = remeasure.decide([_candidate(fast, 600.0, 600.0), _candidate(slow, 500.0, 500.0)])
    assert not verdict.tie and verdict.winner is fast
    assert verdict.text().endswith("bf16 faster by 20.0%, more than the spread")
    # Runs of one configuration that disagree far beyond their spread (600, 600, 480) were
    # disturbed: no verdict is drawn from them; the first measurements decide.
    verdict = remeasure.decide([_candidate(fast, 600.0, 480.0), _candidate(slow, 500.0, 505.0)])
    assert verdict.disturbed and verdict.winner is fast and "disturbed, no verdict" in verdict.text()
    # Within a few of their spreads, runs that differ widen the spread: a tie, the simpler wins.
    verdict = remeasure.decide([_candidate(fast, 600.0, 540.0, spread=0.04),
                                _candidate(slow, 560.0, 565.0, spread=0.04)])
    assert not verdict.disturbed and verdict.tie
    crashed = TrialResult(config=fast.config, label="bf16", status="crash")
    broken = remeasure.Remeasured(fast, [row("bf16", 600.0), crashed])
    verdict = remeasure.decide([broken, _candidate(slow, 500.0, 505.0)])
    assert verdict.winner is slow and "bf16 crash" in verdict.text()
    doc = verdict.to_dict()
    assert doc["winner"] == "fp32" and [r["status"] for r in doc["candidates"][0]["repeats"]] == ["ok", "crash"]


def test_remeasure_runs_the_leaders_interleaved():
    a, b = row("a", 1000.0, config={"precision": "bf16"}), row("b", 990.0)
    order = []

    def run(config, index, total):
        order.append((config.precision, index, total))
        return row(config.label(), 1000.0)

    verdict = remeasure.remeasure([a, b], run, repeats=2)
    assert order == [("bf16", 1, 4), ("fp32", 2, 4), ("bf16", 3, 4), ("fp32", 4, 4)]
    assert verdict.tie and verdict.winner is b  # equal speed: the defaults win
    assert remeasure.remeasure([a], run) is None


def test_a_round_that_no_longer_fits_in_the_time_left_is_not_run():
    a, b = row("a", 1000.0, config={"precision": "bf16"}), row("b", 900.0)
    order = []

    def run(config, index, total):
        order.append(config.precision)
        return row(config.label(), 1000.0 if config.precision == "bf16" else 900.0)

    verdict = remeasure.remeasure([a, b], run, repeats=2, round_fits=lambda: False)
    assert order == ["bf16", "fp32"]  # the first round only: the verdict rests on it
    assert verdict.winner is a and all(len(c.repeats) == 1 for c in verdict.candidates)


def test_tune_re_measures_close_leaders_in_fresh_workers_and_reports_them(tmp_path, monkeypatch):
    from tests.engine.test_search import _search, hold_off_second_runs
    from tuner_tui.engine import search
    from tuner_tui.engine.store import ResultStore

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    hold_off_second_runs(monkeypatch)
    # Every eligible row counts as a leader here, so that the CPU's timings cannot decide
    # whether the re-measurement happens.
    monkeypatch.setattr(remeasure, "MIN_LEADER_GAP", 10.0)
    store = ResultStore(tmp_path / "s.sqlite3")
    outcome, log, executor = _search(store, choices={"optimizer": ("plain", "foreach")},
                                     fixed={"precision": "fp32", "batch_size": 0},
                                     remeasure_repeats=1, steps=3)
    store.close()
    first = [c["optimizer"] for c in executor.sent]
    # The search's two trials, then each leader once more, in a fresh worker, interleaved (a
    # third round where the repeats overturned the first measurements).
    assert first[:2] == ["plain", "foreach"] and sorted(first[2:4]) == ["foreach", "plain"]
    assert len(first) in (4, 6)
    verdict = outcome.remeasured
    assert verdict is not None and len(verdict.candidates) == 2
    assert all(c.repeats[0].status == "ok" for c in verdict.candidates)
    assert all(r.measured_steps >= 3 for c in verdict.candidates for r in c.repeats)
    assert outcome.recommendation is verdict.winner
    assert verdict.text() in log and verdict.text() in outcome.reason
    assert verdict.text() in search.report(outcome)
    assert all(r.step_ms_q1 <= r.step_ms <= r.step_ms_q3 for r in outcome.results)
    assert [e["kind"] for e in outcome.timeline].count("remeasure") == len(first) - 2
    search.write_json(tmp_path / "t.json", outcome)
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [len(c["repeats"]) for c in doc["remeasured"]["candidates"]] in ([1, 1], [2, 2])
    assert doc["remeasured"]["winner"] == outcome.recommendation.label


def test_where_the_leaders_cannot_be_re_measured_in_the_time_left_the_report_says_so(
        tmp_path, monkeypatch):
    """A search whose leaders take longer to re-measure than its whole budget: it searches on
    instead of keeping time back for them, and the report says the first measurements decide."""
    from search_oracle import Oracle
    from simulated_search import simulate
    from tuner_tui.engine import search
    from tuner_tui.engine.search import leaders

    monkeypatch.setattr(remeasure, "MIN_LEADER_GAP", 10.0)  # every eligible row leads
    monkeypatch.setattr(leaders.LeaderRemeasure, "repeat_s", lambda self, r: 10_000.0)
    o = Oracle(5, fault_rate=0.0)
    outcome, _, clock = simulate(o, tmp_path, 300.0)
    assert outcome.remeasured is None
    assert "the leaders were not re-measured" in outcome.remeasure_note
    assert outcome.remeasure_note in outcome.reason and outcome.remeasure_note in search.report(outcome)
    assert not [e for e in outcome.timeline if e["kind"] == "remeasure"]


def test_first_measurements_within_their_spread_are_a_tie_that_tune_gives_the_simpler():
    """Leaders not re-measured (no time left): the first measurements decide, and those within
    their combined spread of the fastest tie; the report says so instead of "x% faster"."""
    from types import SimpleNamespace

    from tuner_tui.engine.search.outcome import recommendation
    from tuner_tui.engine.search.report import SearchOutcome, explain

    import dataclasses

    checked = {"loss_ok": True, "loss_max_rel_error": 1e-3, "loss_tolerance": 0.03}
    compiled = dataclasses.replace(row("bf16 + compile", 1000.0, 0.03, {
        "precision": "bf16", "compile_mode": "default"}, peak=2 << 30), **checked)
    plain = dataclasses.replace(row("bf16", 970.0, 0.03, {"precision": "bf16"}, peak=3 << 30),
                                **checked)
    fp32 = row("fp32", 500.0, 0.01, {}, peak=4 << 30)

    def decided(results):
        search = SimpleNamespace(history=SimpleNamespace(eligible=lambda: list(results)),
                                 leaders=SimpleNamespace(verdicts=[]))
        top, verdict = recommendation(search)
        ranked = sorted(results, key=lambda r: -r.tokens_per_s)
        outcome = SearchOutcome(results=list(results), ranked=ranked, eligible=len(ranked),
                                front=[], recommendation=top, reason="", environment={},
                                workload={}, workload_key="", space=None, budget_bytes=8 << 30)
        return top, verdict, explain(outcome)

    # 3.1% apart, each ±3% (±4.2% together): a tie; bf16 alone changes fewer options.
    top, verdict, reason = decided([compiled, plain, fp32])
    assert top is plain and verdict is None
    assert reason.startswith("the simplest of 2 configurations tied at the top, of 3 that ran")
    assert ("a tie with bf16 + compile: their first measurements lie 3.1% apart, within their "
            "spread (±4.2%); the simpler is recommended") in reason
    assert "faster than the runner-up" not in reason
    # A simpler one whose loss nothing checked (another batch) does not take the tie from the
    # fastest, whose loss the search checks.
    unchecked = dataclasses.replace(plain, loss_ok=None)
    top, _, reason = decided([compiled, unchecked, fp32])
    assert top is compiled and reason.startswith("fastest of 3 configurations")
    # ... but its lead lies within the two's spread, and the report does not call it faster.
    assert ("3.1% ahead of the runner-up (bf16), within their spread (±4.2%): not faster than "
            "the noise allows to say") in reason
    assert "faster than the runner-up" not in reason
    # Outside the spread the fastest wins, and the report gives its lead.
    steady = row("bf16 + compile", 1000.0, 0.005, compiled.config, peak=2 << 30)
    top, _, reason = decided([steady, dataclasses.replace(plain, step_ms_q1=plain.step_ms * 0.995,
                                                          step_ms_q3=plain.step_ms * 1.005), fp32])
    assert top is steady and reason.startswith("fastest of 3 configurations")
    assert "3.1% faster than the runner-up (bf16)" in reason

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
        "re-measured interleaved (2 runs each): bf16 + sdpa + compile 504.0k ±1.0%, "
        "fp32 + sdpa 498.0k ±1.0%: tie, fp32 + sdpa wins as the simpler configuration")
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
    # Repeats that disagree widen the spread: 600 and 480 is ±11%, and 500 lies within it.
    verdict = remeasure.decide([_candidate(fast, 600.0, 480.0), _candidate(slow, 500.0, 505.0)])
    assert verdict.tie and verdict.winner is slow
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


def test_tune_re_measures_close_leaders_in_fresh_workers_and_reports_them(tmp_path, monkeypatch):
    from tests.engine.test_search import CountingRunner, _search
    from tuner_tui.engine import search
    from tuner_tui.engine.store import ResultStore

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    # Every eligible row counts as a leader here, so that the CPU's timings cannot decide
    # whether the re-measurement happens.
    monkeypatch.setattr(remeasure, "MIN_LEADER_GAP", 10.0)
    store = ResultStore(tmp_path / "s.sqlite3")
    runner = CountingRunner()
    outcome, log = _search(store, runner, choices={"optimizer": ("plain", "foreach")},
                           fixed={"precision": "fp32", "batch_size": 0}, remeasure_repeats=1,
                           steps=3)
    store.close()
    first = [(c["optimizer"], n) for c, n in zip(runner.sent, runner.steps)]
    # The search's two trials, then each leader once more, in a fresh worker, interleaved.
    assert [o for o, _ in first] == ["plain", "foreach", "foreach", "plain"] or \
        [o for o, _ in first] == ["plain", "foreach", "plain", "foreach"]
    verdict = outcome.remeasured
    assert verdict is not None and len(verdict.candidates) == 2
    assert all(len(c.repeats) == 1 and c.repeats[0].status == "ok" for c in verdict.candidates)
    assert outcome.recommendation is verdict.winner
    assert verdict.text() in log and verdict.text() in outcome.reason
    assert verdict.text() in search.report(outcome)
    assert all(r.step_ms_q1 <= r.step_ms <= r.step_ms_q3 for r in outcome.results)
    search.write_json(tmp_path / "t.json", outcome)
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [len(c["repeats"]) for c in doc["remeasured"]["candidates"]] == [1, 1]
    assert doc["remeasured"]["winner"] == outcome.recommendation.label


def _row(label, tokens, compile_s=0.0, step_ms=100.0):
    return TrialResult(config={}, label=label, status="ok", tokens_per_s=tokens,
                       compile_s=compile_s, step_ms=step_ms)


def test_the_leaders_re_measured_are_those_whose_repeats_fit_in_the_time_left():
    a, b, c = _row("a", 100.0), _row("b", 99.0), _row("c", 98.0, compile_s=30.0, step_ms=500.0)
    wall = {"a": 40.0, "b": 60.0}  # measured in this search; c was reused from the store
    # c has no wall time here: its compile and a repeat's steps stand in for it.
    assert remeasure.expected_s(c, wall) == 30.0 + (remeasure.MAX_STEPS + 2) * 0.5
    assert remeasure.within_time([a, b, c], wall, 1, 1000.0) == [a, b, c]
    assert remeasure.within_time([a, b, c], wall, 1, 110.0) == [a, b]
    assert remeasure.within_time([a, b, c], wall, 2, 110.0) == []  # 2 x (40 + 60) > 110
    assert remeasure.within_time([a, b], wall, 1, 99.0) == []


def test_a_time_budget_keeps_room_for_the_re_measurement_or_says_it_was_dropped(tmp_path, monkeypatch):
    """Seen on the H200: a 6.2-minute tune re-measured its compiled leaders for 5 more minutes.
    Here each re-measurement is taken to cost 1000 s: with a 1200 s budget the search stops
    starting trials once two leaders need that reserve, and the leaders are not re-measured,
    which the report says."""
    from tests.engine.test_search import CountingRunner, _search
    from tuner_tui.engine import search
    from tuner_tui.engine.store import ResultStore

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(remeasure, "MIN_LEADER_GAP", 10.0)
    monkeypatch.setattr(remeasure, "expected_s", lambda result, wall_s: 1000.0)
    store = ResultStore(tmp_path / "s.sqlite3")
    runner = CountingRunner()
    outcome, log = _search(store, runner, choices={"optimizer": ("plain", "foreach"),
                                                   "batch_size": ("x1", "x2")},
                           fixed={"precision": "fp32"}, remeasure_repeats=1, steps=2,
                           budget_s=1200.0)
    store.close()
    # Two trials made two leaders; the third would have eaten the 2000 s reserve.
    assert len(runner.sent) == 2 and outcome.out_of_time
    assert "kept for a trial and re-measuring the leaders" in log
    assert ", peak " in log  # each trial's progress line says what it held
    assert outcome.remeasured is None
    assert "the leaders were not re-measured" in outcome.remeasure_note
    assert outcome.remeasure_note in outcome.reason and outcome.remeasure_note in search.report(outcome)


def test_no_trial_starts_that_could_join_the_leaders_without_time_to_re_measure_them(tmp_path, monkeypatch):
    """Seen on the H200: with one leader the search kept no reserve, started its last trial 4 s
    before the end of the budget, that trial became a leader, and nothing was re-measured. The
    next trial needs room for itself and for re-measuring it beside the best."""
    from tests.engine.test_search import CountingRunner, _search
    from tuner_tui.engine.store import ResultStore

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(remeasure, "expected_s", lambda result, wall_s: 100.0)
    store = ResultStore(tmp_path / "s.sqlite3")
    runner = CountingRunner()
    outcome, log = _search(store, runner, choices={"optimizer": ("plain", "foreach")},
                           fixed={"precision": "fp32", "batch_size": 0}, remeasure_repeats=1,
                           steps=2, budget_s=60.0)
    store.close()
    # One trial, one leader; the second would need 100 s beside it and its own run: not started.
    assert len(runner.sent) == 1 and outcome.out_of_time
    assert "kept for a trial and re-measuring the leaders" in log


def test_the_reserve_counts_the_next_trial_and_its_re_measurement_beside_the_best():
    a, b = _row("a", 100.0), _row("b", 80.0)  # b is 20% behind: not a leader
    wall = {"a": 40.0, "b": 60.0}
    # median trial 50 s; re-measuring a (40) beside a trial like it (50), once: 90
    assert remeasure.reserve_s([a, b], wall, 1) == 50.0 + 90.0
    assert remeasure.reserve_s([a, b], wall, 2) == 50.0 + 180.0
    c = _row("c", 99.0)
    wall["c"] = 200.0  # two leaders whose re-measurement costs more than the guess
    assert remeasure.reserve_s([a, b, c], wall, 1) == 60.0 + 240.0
    assert remeasure.reserve_s([], wall, 1) == 0.0  # nothing fits yet: search on


def test_a_measurement_goes_on_while_noisy_within_its_cap():
    assert noise.adaptive_cap(20) == 20 * noise.ADAPTIVE_FACTOR
    assert noise.adaptive_cap(20, 20) == 20 and noise.adaptive_cap(20, 5) == 20
    quiet = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8]
    burst = [10.0, 10.1, 25.0, 30.0, 9.9, 28.0]
    assert noise.settled(quiet) and not noise.settled(burst)
    # A burst of load outvoted by the quiet steps after it: settled again.
    assert noise.settled(burst + quiet * 3)
    assert noise.times_spread([]) is None and noise.settled([])


def test_an_early_stop_needs_several_steps_and_a_gap_beyond_the_combined_spread():
    best_ms = 39.0
    # One noisy reading among the first three (the "median 886.5 ms > 39.0 ms").
    assert not noise.clearly_slower([40.0, 886.5, 900.0], best_ms, 0.02, min_steps=3)
    # As fast as the best on a noisy host: its faster quarter is not slower beyond the spreads.
    noisy_same = [30.0, 60.0, 38.0, 90.0, 41.0, 35.0, 80.0, 39.0]
    assert not noise.clearly_slower(noisy_same, best_ms, 0.3)
    # Twice as slow, steadily: stopped after STOP_MIN_STEPS steps, not before.
    slow = [78.0, 79.0, 80.0, 81.0, 79.5, 80.5]
    assert not noise.clearly_slower(slow[: noise.STOP_MIN_STEPS - 1], best_ms)
    assert noise.clearly_slower(slow[: noise.STOP_MIN_STEPS], best_ms, 0.02)
    # 3% slower with a 5% spread on both sides: a tie, not a stop.
    near = [40.2, 40.0, 39.9, 40.4, 40.1, 40.3]
    assert not noise.clearly_slower(near, best_ms, 0.05)

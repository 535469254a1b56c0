"""The search's logic, tested by simulation: hundreds of searches on synthetic machines and
models (tests/engine/search_oracle.py), each on a virtual clock in well under a second, with the
real driver, strategy, memory model, priors, re-measurement, result store and reference cache.

What is checked is what `gputune tune` promises: an answer close to the best the space holds
within its time budget, better than the staged search it replaced; an answer that never gets
worse with more time, is not thrown off by options that change nothing, fits a tight budget by
the cheapest lever, survives every fault, never declares a disturbed re-measurement a verdict,
and runs the fp32 reference once per workload.
"""

from __future__ import annotations

import io
import json
import math
import re
import statistics

import pytest

from search_oracle import GPU_BYTES, Oracle
from simulated_search import LegacyStaged, regret, simulate
from strategies.config import TuneConfig
from tuner_tui.engine import remeasure
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference_cache import ReferenceCache
from tuner_tui.engine.search import report, write_json
from tuner_tui.engine.runner import NO_RESULT
from tuner_tui.engine.search.deadline import GRACE_S, OVERRUN_SHARE
from tuner_tui.engine.search import surprise
from tuner_tui.engine.search.expert import memory_moves
from tuner_tui.engine.search.space import steps_with_torchao

FIVE_MINUTES = 300.0
MEAN_REGRET = 0.07
"""The mean regret at five minutes each fifty of these searches stays under (on 2026-12-07 the
four fifties gave 3.7%, 4.4%, 6.0% and 3.7%, 4.2% over seeds 0-999; before, the bound was 10%,
from when the 200 gave about 5%: a regression of several points passed it).
`benchmarks/simulated_regret.py` gives the figures by model size; docs/search.md says what is
measured, and why the issue's 2% is not reached at five minutes for models of a billion
parameters and more."""


def _regrets(seeds, budget_s, tmp_path, strategy=None, **oracle):
    found = []
    for seed in seeds:
        o = Oracle(seed, **oracle)
        outcome, _, _ = simulate(o, tmp_path / f"{seed}-{budget_s}-{bool(strategy)}", budget_s,
                                 strategy=strategy)
        found.append(regret(o, outcome))
    return found


@pytest.fixture
def folder(tmp_path):
    def make(name):
        path = tmp_path / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    return make


@pytest.mark.parametrize("chunk", range(4))
def test_over_200_oracles_the_search_comes_close_to_the_optimum_and_beats_the_staged_one(
        chunk, tmp_path):
    seeds = range(50 * chunk, 50 * chunk + 50)
    anytime = _regrets(seeds, FIVE_MINUTES, tmp_path)
    staged = _regrets(seeds, FIVE_MINUTES, tmp_path, strategy=LegacyStaged)
    print(f"seeds {seeds}: mean regret {statistics.mean(anytime):.3f} (staged "
          f"{statistics.mean(staged):.3f})")
    assert statistics.mean(anytime) <= MEAN_REGRET
    assert statistics.mean(anytime) < statistics.mean(staged) / 2


def test_the_result_never_gets_worse_as_the_budget_grows(tmp_path):
    """The same oracles at 3, 6, 8.4 and 12 minutes (no faults: a crash falls on another trial
    in each): the mean regret falls with every step, and hardly a search ends worse with more
    time than with less by more than the noise of one measurement (the searches part ways once
    the time left changes what fits in it, and a myopic search may take the longer road)."""
    seeds = range(300, 312)  # (mean regret 6.5%, 4.9%, 3.3%, 1.9%; none worse by 3%)
    by_budget = [_regrets(seeds, minutes * 60, tmp_path, fault_rate=0.0)
                 for minutes in (3, 6, 8.4, 12)]
    means = [statistics.mean(r) for r in by_budget]
    print("mean regret at 3, 6, 8.4, 12 min:", [round(m, 3) for m in means])
    assert means == sorted(means, reverse=True)
    worse = sum(b > a + 0.03 for shorter, longer in zip(by_budget, by_budget[1:])
                for a, b in zip(shorter, longer))
    assert worse <= 0.1 * 3 * len(seeds)


INERT = {"fp8_layers": ("auto", "all"), "compile_fullgraph": (False, True),
         "checkpoint_every": (2, 4), "kernels_with_compile": ("inductor-first", "all"),
         "grad_clip": (1.0, 0.5)}
"""Five options the oracles' throughput does not depend on."""


def test_five_options_that_change_nothing_move_the_five_minute_result_by_less_than_1_percent(
        tmp_path):
    seeds = range(400, 420)  # (+0.09%: two of the 20 answers changed)
    plain, widened = [], []
    for seed in seeds:
        o = Oracle(seed, inert_options=tuple(INERT))
        outcome, _, _ = simulate(o, tmp_path / f"a{seed}", FIVE_MINUTES)
        plain.append(o.true_speed(outcome.recommendation.tune_config) or 0.0)
        o = Oracle(seed, inert_options=tuple(INERT))
        outcome, _, _ = simulate(o, tmp_path / f"b{seed}", FIVE_MINUTES, choices=INERT)
        widened.append(o.true_speed(outcome.recommendation.tune_config) or 0.0)
    change = statistics.mean(w / p for p, w in zip(plain, widened) if p) - 1
    print(f"five options that change nothing: {change:+.2%}")
    assert abs(change) < 0.01


def _single_closers(o: Oracle, space, config: TuneConfig) -> list[tuple[float, TuneConfig]]:
    """The true speed of each single memory lever added to `config` that makes it fit."""
    found = []
    for _, closer in memory_moves(space, config):
        speed = o.true_speed(closer)
        if speed is not None:
            found.append((speed, closer))
    return sorted(found, key=lambda item: -item[0])


def test_a_budget_just_under_the_lean_configuration_is_met_by_the_cheapest_closing_lever(
        tmp_path):
    """The budget is set a few percent under the lean configuration's peak (bf16 weights and
    state, SDPA, the fused loss, compile): the search closes the gap, never recommends what is
    over the budget, and in most cases loses no more speed than the cheapest single lever that
    closes it (where it does not, the estimate that chose the lever was off)."""
    met, total = 0, 0
    for seed in range(500, 530):
        o = Oracle(seed, budget_kind="none", fault_rate=0.0)
        o.budget = int(o.peak(o.lean_config()) * 0.93)
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        top = outcome.recommendation
        assert top is not None, f"seed {seed}: no recommendation under a reachable budget"
        assert o.peak(top.tune_config) <= o.budget or top.peak_reserved_bytes <= o.budget
        closers = _single_closers(o, outcome.space, outcome.space.canonical(o.lean_config()))
        if not closers:
            continue
        total += 1
        met += (o.true_speed(top.tune_config) or 0) >= 0.98 * closers[0][0]
    print(f"as fast as the cheapest closing lever in {met} of {total}")
    assert met >= 0.8 * total


class Raising:
    """An executor that fails now and then: a trial whose run raises, as a bug would, and one
    the worker refuses (status invalid, as for a combination its checks refuse); its C++
    build cannot be spawned."""

    def __init__(self, inner, every: int) -> None:
        self.inner, self.every, self.count = inner, every, 0

    def start(self):
        return self.inner.start()

    def warm_optimizer_steps(self, variants):
        self.inner.warm_optimizer_steps(variants)

    def optimizer_steps_compiled(self):
        return self.inner.optimizer_steps_compiled()

    def optimizer_steps_notes(self):
        return self.inner.optimizer_steps_notes()

    def build_native(self):
        raise OSError("injected: the build process could not be spawned")

    def native_build_summary(self):
        return None

    def run(self, config, *args):
        self.count += 1
        if self.count % self.every == 0:
            raise RuntimeError("injected: the executor broke")
        if self.count % self.every == 1 and self.count > 1:
            return TrialResult(config=config.to_dict(), label=config.label(), status="invalid",
                               message="injected: refused by the worker's checks")
        return self.inner.run(config, *args)

    def close(self):
        self.inner.close()


def test_injected_faults_never_raise_and_the_outcome_is_always_written(tmp_path):
    from simulated_search import Clock, OracleExecutor

    from tuner_tui.engine.protocol import WorkerSpec
    from tuner_tui.engine.search import Search, SearchPlan, export
    from tuner_tui.engine.store import ResultStore

    # (seeds whose searches live to a fifth call, the first the executor refuses: some of 600-639
    # end before it, their trials hung; since the fp32 reference stops at a crash, 602 and 603)
    for seed in range(629, 635):
        o = Oracle(seed, fault_rate=0.4)
        o.ro_fails = o.fp8_fails = o.fp16_diverges = True
        clock = Clock()
        executor = Raising(OracleExecutor(o, clock), every=4)
        plan = SearchPlan(WorkerSpec(workload=f"oracle-{seed}", device="cuda"),
                          max_memory_bytes=o.budget, budget_s=FIVE_MINUTES)
        store = ResultStore(tmp_path / f"s{seed}.sqlite3", on_problem=lambda m: None)
        out = io.StringIO()
        outcome = Search(plan, store, out=out, executor=executor, clock=clock,
                         references=ReferenceCache(tmp_path / f"r{seed}")).run()
        store.close()
        assert "C++ build beside the trials could not start: OSError: injected" in out.getvalue()
        statuses = {r.status for r in outcome.results}
        assert {"error", "invalid"} <= statuses and statuses & {"crash", "compile"}
        assert all(r.message for r in outcome.results if r.status == "error")
        text = report(outcome)
        write_json(tmp_path / f"{seed}.json", outcome)
        doc = json.loads((tmp_path / f"{seed}.json").read_text())
        assert len(doc["timeline"]) >= len(outcome.results) and "could not run" in text
        if outcome.recommendation is not None:
            assert export(outcome, tmp_path / f"{seed}.toml").exists()


def test_an_error_of_the_search_itself_ends_it_with_an_outcome(tmp_path, monkeypatch):
    from tuner_tui.engine.search import anytime

    calls = {"n": 0}
    real = anytime.AnytimeSearch._best_candidate

    def broken(self, history):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("injected: the strategy broke")
        return real(self, history)

    monkeypatch.setattr(anytime.AnytimeSearch, "_best_candidate", broken)
    o = Oracle(7, fault_rate=0.0)
    outcome, _, _ = simulate(o, tmp_path, FIVE_MINUTES)
    assert outcome.error == "ValueError: injected: the strategy broke"
    assert outcome.results and outcome.recommendation is not None
    assert "internal error" in report(outcome)
    write_json(tmp_path / "t.json", outcome)
    assert json.loads((tmp_path / "t.json").read_text())["error"] == outcome.error


def _run(label: str, tokens: float, spread: float = 0.005, config: dict | None = None):
    step = 1000.0 / tokens
    return TrialResult(config=config or {}, label=label, status="ok", tokens_per_s=tokens,
                       step_ms=step, step_ms_q1=step * (1 - spread), step_ms_q3=step * (1 + spread))


def test_a_30_percent_disturbance_in_one_repeat_is_flagged_not_declared():
    a = _run("a", 100.0, config={"precision": "bf16"})
    b = _run("b", 98.0)
    candidates = [remeasure.Remeasured(a, [_run("a", 70.0), _run("a", 100.5)]),
                  remeasure.Remeasured(b, [_run("b", 98.5), _run("b", 97.5)])]
    verdict = remeasure.decide(candidates)
    assert verdict.disturbed and candidates[0].disturbed() and not candidates[1].disturbed()
    assert "disturbed, no verdict" in verdict.text() and "faster by" not in verdict.text()
    assert verdict.winner is a  # the first measurements decide: a led by 2%, beyond the spread
    # Undisturbed, the same first measurements and repeats that agree give a verdict.
    calm = [remeasure.Remeasured(a, [_run("a", 100.2), _run("a", 99.8)]),
            remeasure.Remeasured(b, [_run("b", 98.5), _run("b", 97.5)])]
    assert not remeasure.decide(calm).disturbed and remeasure.decide(calm).winner is a


def test_repeats_that_overturn_the_first_measurements_get_a_third_round():
    a = _run("a", 100.0, spread=0.02, config={"precision": "bf16"})
    b = _run("b", 95.0, spread=0.02)
    speeds = {"a": [93.0, 93.0, 93.0], "b": [99.0, 99.0, 99.0]}
    calls = []

    def run(config, index, total):
        label = "a" if config.precision == "bf16" else "b"
        calls.append(label)
        return _run(label, speeds[label][len([c for c in calls if c == label]) - 1], spread=0.02)

    verdict = remeasure.remeasure([a, b], run, repeats=2)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # two rounds, then a third
    assert verdict.winner is b and not verdict.disturbed


def test_a_round_the_time_budget_cuts_short_is_dropped_and_the_whole_ones_decide():
    a = _run("a", 100.0, spread=0.01, config={"precision": "bf16"})
    b = _run("b", 95.0, spread=0.01)

    def late(label):
        return TrialResult(config=(a if label == "a" else b).config, label=label,
                           status=remeasure.OUT_OF_TIME, message="not run: the time budget ended")

    def rounds(cut_at):
        calls = []

        def run(config, index, total):
            label = "a" if config.precision == "bf16" else "b"
            calls.append(label)
            if len(calls) >= cut_at:
                return late(label)
            return _run(label, {"a": 100.0, "b": 95.0}[label], spread=0.01)
        return remeasure.remeasure([a, b], run, repeats=2)

    kept = rounds(cut_at=4)  # round two's second run cut: round one decides
    assert not kept.out_of_time and kept.winner is a and "faster by" in kept.text()
    assert all(len(c.repeats) == 1 for c in kept.candidates)
    cut = rounds(cut_at=2)  # round one cut: the first measurements decide
    assert cut.out_of_time and cut.winner is a
    assert "the time budget ended the repeats" in cut.text()


def test_one_fp32_reference_pass_per_workload_key_across_searches(tmp_path):
    o = Oracle(11, budget_kind="none", fault_rate=0.0)
    refs = ReferenceCache(tmp_path / "refs")
    first, _, _ = simulate(o, tmp_path, FIVE_MINUTES, references=refs,
                           store_path=tmp_path / "one.sqlite3")
    keys = {p.parent.name for p in (tmp_path / "refs").glob("*/losses.json")}
    assert refs.passes == len(keys) >= 1
    sketches = set(o.reference_grads)
    # A second search of the same workload on the same machine, its store empty: every trial
    # runs again, the reference never does.
    again = Oracle(11, budget_kind="none", fault_rate=0.0)
    again.reference_grads = set(sketches)
    second, _, _ = simulate(again, tmp_path, FIVE_MINUTES, references=refs,
                            store_path=tmp_path / "two.sqlite3")
    assert not [e for e in second.timeline if e["kind"] == "reference"]
    assert refs.passes == len(keys)
    # The workers found the gradients' sketch of each key the first search made.
    assert sketches <= again.reference_grads


def test_the_time_budget_is_used_and_the_time_line_says_how(tmp_path):
    for seed in range(700, 720):
        o = Oracle(seed, fault_rate=0.0)
        outcome, _, clock = simulate(o, tmp_path, FIVE_MINUTES)
        walls = [e["ended_s"] - e["started_s"] for e in outcome.timeline]
        assert clock.now <= FIVE_MINUTES + max(walls)  # at most the last trial runs over
        unused = FIVE_MINUTES - clock.now
        # At most a trial's time is left unused, or less than any trial that could still gain
        # would take (seed 709: 33 s left, where only moves that cannot gain fitted).
        assert unused <= max(walls) or (
            "would take longer than the time left" in outcome.end_note), \
            f"seed {seed}: {unused:.0f} s unused"
        first = outcome.timeline[0]
        assert first["why"] == "the fp32 eager baseline" and first["started_s"] >= 0
        # (its eager version first)
        assert any(e["why"].startswith("the expert's recipe") for e in outcome.timeline)
        assert all(a["ended_s"] <= b["started_s"] + 1e-9 or b["kind"] == "reference"
                   for a, b in zip(outcome.timeline, outcome.timeline[1:]))


def test_the_eager_recipe_runs_first_and_the_compiled_one_follows(tmp_path):
    """Right after the baseline the expert's recipe runs without torch.compile and holds an
    answer within seconds (a model of billions of parameters compiles for minutes); the
    compiled recipe follows where it still fits in the time left."""
    seen = {"large": 0, "small": 0}
    for seed in range(900, 960):
        o = Oracle(seed, fault_rate=0.0, budget_kind="none")  # (over a budget: no answer yet)
        size = "large" if o.params >= 1.5e9 else "small" if o.params < 3e8 else None
        if size is None or seen[size] >= 3:
            continue
        seen[size] += 1
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        trials = [e for e in outcome.timeline if e["kind"] == "trial"]
        whys = [e["why"] for e in trials]
        eager = [i for i, why in enumerate(whys)
                 if why.startswith("the expert's recipe without compile")]
        assert eager == [1], whys  # right after the baseline
        first = trials[1]
        assert "compile" not in first["label"]
        if first["status"] == "ok":  # an answer after one short trial
            assert first["best_tokens_per_s"] is not None
            # (a large model's eager recipe, with bf16 weights, compiles torchao's AdamW step
            # first: the HF Llama's ended at 2m17s on an H100)
            assert first["ended_s"] < (150 if size == "large" else 40)
        # The compiled recipe follows, where it still fits in the time left (after the eager
        # one with an option changed, where that fits beside it).
        # (quoted whole and per block: the scope is chosen once the eager recipe has run)
        took, block, left = map(float, re.findall(
            r"about (\d+) s whole or (\d+) s per block, of the (\d+) s", whys[1])[0])
        assert block < took
        after = next(e for e in trials[2:] if not e["why"].startswith("the eager recipe with"))
        scouted = sum(e["ended_s"] - e["started_s"] for e in trials[2:trials.index(after)])
        if took <= left - (first["ended_s"] - first["started_s"]) - scouted - 5:
            assert after["why"] == "the expert's recipe" and "compile" in after["label"], whys
        else:  # (the whole model's compile, quoted, would not fit: per block, or none)
            assert all("per-block" in e["label"] for e in trials
                       if e["why"] == "the expert's recipe"), whys
    assert seen == {"large": 3, "small": 3}


def _batch_of(event: dict, o: Oracle) -> int:
    found = re.search(r"batch (\d+)", event["label"])
    return int(found.group(1)) if found else o.default_batch


def test_the_eager_recipe_with_an_option_changed_tells_the_compiled_one(tmp_path):
    """Between the two recipes, the eager one with its batch doubled (a larger micro-batch, not
    more of them accumulated), then with its weights' other precision, where each and the
    compiled recipe fit in the time left; each scout changes the fastest eager run before it
    (the doubled batch where that ran faster: GPT-2's bf16 weights, judged at the eager
    recipe's batch of 16, lost to torchao's per-tensor step on an H100). The compiled recipe
    takes each change that ran faster than its scout's base (beyond their spread: a tie goes
    by the prior, and is not checked here)."""
    from tuner_tui.engine.noise import spread, tie_gap

    seen = {"batch taken": 0, "batch left": 0, "weights taken": 0, "weights left": 0,
            "weights at the doubled batch": 0}
    for seed in range(900, 1100):
        if min(seen.values()) >= 2:
            break
        o = Oracle(seed, fault_rate=0.0, budget_kind="none")
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        trials = [e for e in outcome.timeline if e["kind"] == "trial"]
        scouts = [e for e in trials if e["why"].startswith("the eager recipe with")]
        if not scouts:
            continue
        assert trials[2:2 + len(scouts)] == scouts, [e["why"] for e in trials]
        base = eager = trials[1]
        compiled = next((e for e in trials if e["why"] == "the expert's recipe"), None)
        if compiled is None:  # the scouts ran longer than predicted: it no longer fitted
            continue
        assert "compile" in compiled["label"]
        rows = {r.label: r for r in outcome.results}
        for scout in scouts:
            assert "compile" not in scout["label"]
            a, b = rows[scout["label"]], rows[base["label"]]  # (a confirmed run: the faster)
            faster = a.status == "ok" and a.tokens_per_s > b.tokens_per_s
            before, base = base, (scout if faster else base)
            if scout["why"].startswith("the eager recipe with fp8"):
                continue  # (float8's own test below)
            if abs(math.log(a.tokens_per_s / b.tokens_per_s)) <= tie_gap(spread(a), spread(b)):
                continue
            if "batch" in scout["why"]:
                assert _batch_of(scout, o) == 2 * _batch_of(before, o)
                assert "micro" not in scout["label"]
                assert _batch_of(compiled, o) == _batch_of(scout if faster else before, o)
                seen["batch taken" if faster else "batch left"] += 1
            else:
                assert "weights" in scout["why"]
                assert _batch_of(scout, o) == _batch_of(before, o)
                if before is not eager:
                    seen["weights at the doubled batch"] += 1
                if faster and _batch_of(compiled, o) != _batch_of(before, o):
                    continue  # (fp32 weights at the batch the other scout doubled may not fit)
                bf16 = ["bf16 weights" in e["label"] for e in (before, scout, compiled)]
                assert bf16[0] != bf16[1] and bf16[2] == (bf16[1] if faster else bf16[0])
                seen["weights taken" if faster else "weights left"] += 1
    assert min(seen.values()) >= 2, seen


def test_the_compiled_recipes_float8_is_tried_eager_first_and_dropped_where_it_fails(tmp_path):
    """Where the compiled recipe has float8, the eager recipe runs with it first: where that
    fails (a float8 that does not run here, or loses the loss), the compiled recipe goes
    without it; where it runs, the compiled recipe keeps it."""
    seen = {"kept": 0, "dropped": 0}
    for seed in range(120):
        if min(seen.values()) >= 2:
            break
        o = Oracle(seed, fault_rate=0.0)
        if o.params < 1e9:  # (float8's prior pays on large models only)
            continue
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        trials = [e for e in outcome.timeline if e["kind"] == "trial"]
        scout = next((e for e in trials if e["why"].startswith("the eager recipe with fp8")), None)
        compiled = next((e for e in trials if e["why"] == "the expert's recipe"), None)
        if scout is None or compiled is None:
            continue
        assert "compile" not in scout["label"] and "fp8" in scout["label"]
        assert trials.index(scout) < trials.index(compiled)
        failed = scout["status"] in ("compile", "loss-mismatch")
        assert failed == (o.fp8_fails or o.fp8_numerics), (seed, scout["status"])
        assert ("fp8" in compiled["label"]) != failed, (seed, compiled["label"])
        seen["dropped" if failed else "kept"] += 1
    assert min(seen.values()) >= 2, seen


def test_a_trial_far_below_its_prediction_runs_once_more_and_the_faster_run_stands(tmp_path):
    """A disturbed run (the oracle's: 30% slower, 3% of trials) must not close a direction the
    priors said pays: a contender measured far below its prediction runs again at once."""
    found = 0
    for seed in range(1000, 1200):
        o = Oracle(seed, fault_rate=0.0)
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES, remeasure_repeats=0)
        events = outcome.timeline
        for before, event in zip(events, events[1:]):
            if event["kind"] != "confirm" or event["why"] != surprise.WHY:
                continue
            found += 1
            assert before["kind"] == "trial" and before["label"] == event["label"], event
            [row] = [r for r in outcome.results if r.label == event["label"]]
            speeds = [x for x in (before["tokens_per_s"], event["tokens_per_s"]) if x]
            assert row.tokens_per_s == max(speeds)
        if found >= 3:
            break
    assert found >= 3


def test_a_move_far_above_its_prediction_has_its_parent_run_once_more(tmp_path):
    """A disturbance only slows a run: where a move measures far above what its parent's run
    predicted, that parent may have been disturbed, and runs again (an expert's recipe measured
    early, with a wide doubt, escapes the rule above). The faster run stands; the oracle's
    disturbed runs came back about 1/0.7 faster."""
    found, recovered = 0, 0
    for seed in range(1000, 1100):
        o = Oracle(seed, fault_rate=0.0)
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES, remeasure_repeats=0)
        events = outcome.timeline
        for i, event in enumerate(events):
            if event["kind"] != "confirm" or event["why"] != surprise.WHY_PARENT:
                continue
            found += 1
            assert events[i - 1]["kind"] == "trial" and events[i - 1]["label"] != event["label"]
            [first] = [e for e in events[:i] if e["label"] == event["label"]]
            [row] = [r for r in outcome.results if r.label == event["label"]]
            assert row.tokens_per_s == max(first["tokens_per_s"], event["tokens_per_s"] or 0)
            recovered += (event["tokens_per_s"] or 0) > 1.3 * first["tokens_per_s"]
        if found >= 3:
            break
    assert found >= 3 and recovered >= 2, (found, recovered)


def test_torchao_s_steps_compiled_beside_the_trials_spare_the_trial_that_steps_with_them(
        tmp_path):
    """On the GPU the search has the space's torchao pairs compiled by a worker of their own
    from its start, (bf16 weights, fp32 state) first; an eager trial of a pair compiled by the
    time it starts reads its step from the cache, and the outcome says what was compiled."""
    spared, searches = 0, 0
    for seed in range(40):
        o = Oracle(seed, fault_rate=0.0)
        outcome, executor, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        assert list(executor.warm_ready)[0] == ("bf16", "fp32")
        assert outcome.optimizer_steps  # at least the first pair, within five minutes
        searches += 1
        for event in outcome.timeline:
            row = next((r for r in outcome.results if r.label == event["label"]), None)
            if row is None or row.status != "ok" or event["kind"] != "trial":
                continue
            config = row.tune_config
            ready = executor.warm_ready.get((config.weights, config.optimizer_state))
            if config.compile_mode == "off" and steps_with_torchao(config) and ready is not None \
                    and ready <= event["started_s"]:
                assert row.compile_s <= 1.0 + 3.0  # an eager first step, and the cache read
                spared += 1
                break
    assert spared >= searches // 2, (spared, searches)  # 32 of 40 when written


def test_gputune_optimizer_warmup_0_leaves_each_trial_to_compile_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_OPTIMIZER_WARMUP", "0")
    out = io.StringIO()
    outcome, executor, _ = simulate(Oracle(3, fault_rate=0.0), tmp_path, FIVE_MINUTES, out=out)
    assert executor.warm_ready == {} and outcome.optimizer_steps == {}
    assert "torchao's AdamW steps" not in out.getvalue()


def test_the_kernels_c_plus_plus_build_starts_with_the_search_where_kernels_are_searched(
        tmp_path, monkeypatch):
    """On a GPU the fused kernels' C++ nodes build beside the first trials, not in the first
    trial with kernels; not where no kernel set is searched, nor with GPUTUNE_NATIVE=0."""
    out = io.StringIO()
    _, executor, _ = simulate(Oracle(3, fault_rate=0.0), tmp_path / "a", 30.0, out=out)
    assert executor.native_asked
    assert "building the fused kernels' C++ nodes beside the trials" in out.getvalue()
    _, executor, _ = simulate(Oracle(3, fault_rate=0.0), tmp_path / "b", 30.0,
                              fixed={"fused_kernels": ()})
    assert not executor.native_asked
    monkeypatch.setenv("GPUTUNE_NATIVE", "0")
    _, executor, _ = simulate(Oracle(3, fault_rate=0.0), tmp_path / "c", 30.0)
    assert not executor.native_asked


def test_the_search_ends_by_saying_what_the_optimizer_steps_worker_compiled(tmp_path):
    """One line before the report, and the JSON, say which pairs were compiled and which were
    not reached: a worker that did nothing is not silent."""
    out = io.StringIO()
    outcome, executor, _ = simulate(Oracle(3, fault_rate=0.0), tmp_path, 30.0, out=out)
    lines = [line for line in out.getvalue().splitlines()
             if line.startswith("torchao's AdamW steps beside the trials:")]
    assert len(lines) == 1  # once, at the end
    assert "not reached: " in lines[0]  # half a minute is too short for every pair
    write_json(tmp_path / "tune.json", outcome)
    written = json.loads((tmp_path / "tune.json").read_text())
    assert written["optimizer_steps_compiled"] == outcome.optimizer_steps
    assert written["optimizer_steps_notes"] == []


def test_a_second_model_on_the_same_machine_starts_from_what_the_first_taught(tmp_path):
    """Two models on one machine (the levers' true effects shared): the second search, given
    the first's store, ends closer to its optimum in two minutes than without it, and more of
    its searches gain by the store than lose. (At two minutes the priors decide most of the
    path: over seeds 800-859, 0.1023 against 0.1060 mean regret, 11 better and 7 worse, with
    torchao's steps compiled beside the trials; 0.1045 against 0.1135, 12 better and 3 worse,
    before; at three minutes the store's gain shrank to 0.01%, as the second search's own trials
    have taught it the same by then. Over 800-829 alone it is now 5 better, 5 worse. The first
    model's search ran ten minutes before; at five it gives 0.1022 against 0.1060, 10 better
    and 6 worse, in two thirds of the test's time.)"""
    with_store, without = [], []
    for seed in range(800, 860):
        first = Oracle(seed)
        simulate(first, tmp_path / f"w{seed}", 300.0, store_path=tmp_path / f"shared{seed}.sqlite3")
        second = Oracle(seed + 10_000, shared_truth=first)
        outcome, _, _ = simulate(second, tmp_path / f"w{seed}", 120.0,
                                 store_path=tmp_path / f"shared{seed}.sqlite3")
        with_store.append(regret(second, outcome))
        second = Oracle(seed + 10_000, shared_truth=first)
        outcome, _, _ = simulate(second, tmp_path / f"n{seed}", 120.0)
        without.append(regret(second, outcome))
    better = sum(a < b - 1e-9 for a, b in zip(with_store, without))
    worse = sum(a > b + 1e-9 for a, b in zip(with_store, without))
    print(f"second model at 2 min: {statistics.mean(with_store):.3f} with the first's store, "
          f"{statistics.mean(without):.3f} without; {better} better, {worse} worse")
    assert statistics.mean(with_store) < statistics.mean(without)
    assert better > worse


def test_numerics_that_fail_are_never_recommended_even_when_checked_after_the_run(tmp_path):
    # On this oracle float8 loses the loss; with an hour the search grows the batch, where the
    # fp32 reference is run only once a float8 configuration leads, and its losses are then
    # checked after the run: the check must catch it, as the worker's own does.
    o = Oracle(6)
    assert o.fp8_numerics
    outcome, executor, _ = simulate(o, tmp_path, 3600.0)
    assert any(c.fp8 != "off" and (c.batch_size or o.default_batch) != o.default_batch
               for c in executor.trials)
    top = outcome.recommendation
    assert top is not None and o.numerics_ok(top.tune_config)
    assert regret(o, outcome) < 0.1


def test_an_fp32_reference_the_models_shapes_put_past_the_device_is_not_run(tmp_path):
    # A 1.9B model: the fp32 baseline runs out of memory, after counting its parameters; the
    # plain fp32 reference with SDPA (165 GiB) would too, and is not tried: the checkpointed one
    # runs at once.
    o = Oracle(9)
    outcome, executor, _ = simulate(o, tmp_path, 300.0)
    fp32 = [c for c in executor.trials if c.precision == "fp32"]
    assert fp32[0] == outcome.space.start() and o.peak(fp32[0]) > GPU_BYTES
    assert all(c.checkpointing != "off" for c in fp32[1:]) and len(fp32) == 2
    assert all(o.peak(c) <= GPU_BYTES for c in fp32[1:])
    assert regret(o, outcome) < 1.0


def test_the_failed_compile_of_the_expert_is_not_chased_through_its_eager_variants(tmp_path):
    # CUDA graphs fail to compile on this oracle, and the expert's recipe used them. The moves
    # from it that drop the compile are predicted from what the trials since then measured, not
    # from the expert's guess made from the fp32 baseline: one such trial, not eight.
    o = Oracle(252)
    assert o.ro_fails
    outcome, _, _ = simulate(o, tmp_path, 300.0)
    whys = [t["why"] for t in outcome.timeline]
    expert = next(t for t in outcome.timeline if t["why"] == "the expert's recipe")
    assert expert["status"] == "compile"
    assert sum("compile_mode reduce-overhead -> off" in w for w in whys) <= 2
    assert regret(o, outcome) < 0.12  # (10.6% since the oracle's optimizer step is on top)


def test_the_leaders_re_measure_ends_with_the_time_budget(tmp_path):
    # A re-measured configuration compiles again from the cache in 0.1 to 0.6 of its first
    # compile (as on the H200, where a re-measure planned for 89 s took 147 s): a round that
    # no longer fits in the time left, as long as the last one took, is not run, and a repeat
    # still running GRACE_S past the budget is stopped.
    for seed in range(25):
        o = Oracle(seed, fault_rate=0.0)
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        late = [e for e in outcome.timeline
                if e["kind"] == "remeasure" and e["ended_s"] > FIVE_MINUTES + GRACE_S]
        assert not late, f"seed {seed}: a re-measure ran to {late[-1]['ended_s']:.0f} s"


def test_leaders_found_after_a_verdict_and_not_re_measured_are_named(tmp_path):
    # (ResNet-50 on the H200: a verdict on two leaders, then a trial that made two new ones with
    # no time left; "the leaders were not re-measured" beside the verdict read as a contradiction)
    # The case is rare (two oracles of 0-1399, 765 and 1215, since moves that only cost speed
    # are not tried from the best; 240 and 853 of 0-1079 before): the search starts at them,
    # and goes on past them where the search changed.
    for seed in range(765, 1400):
        outcome, _, _ = simulate(Oracle(seed, fault_rate=0.0), tmp_path / str(seed), FIVE_MINUTES)
        if outcome.remeasured is not None and "not re-measured" in outcome.remeasure_note:
            break
    else:
        pytest.fail("no search re-measured leaders and then found new ones")
    names = outcome.remeasure_note.split("the leaders (", 1)[1].split(") were not re-measured")[0]
    verdict_on = {c.label for c in outcome.remeasured.candidates}
    named = set(names.split(" and "))
    assert len(named) == 2 and named != verdict_on


def test_a_repeat_that_compiles_as_long_as_cold_ends_within_the_grace_of_the_budget(tmp_path):
    """The leaders' re-measure is planned with a compile from the cache; where the repeat
    compiles as long as cold (an HF Llama with float8 and CUDA graphs on the H200 ran 37 s past
    five minutes), no repeat starts once it no longer fits, one is stopped at the budget's end
    plus GRACE_S, and the first measurements decide."""

    cut = 0
    # (Since a move may use the re-measure's time, few re-measures start to be cut: since moves
    # that only cost speed are not tried from the best, two oracles of 0-999, 692 and 806;
    # before, 188 and 662; before, 532, 692 and 992; before that, three of 100-399; before
    # that, one of the first 200.)
    for seed in (692, 806):
        o = Oracle(seed, fault_rate=0.0, warm_share=(1.0, 1.3))
        outcome, _, clock = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        repeats = [e for e in outcome.timeline if e["kind"] == "remeasure"]
        assert all(e["ended_s"] <= FIVE_MINUTES + GRACE_S + 1 for e in repeats), seed
        verdict = outcome.remeasured
        if verdict is not None and verdict.out_of_time:
            cut += 1
            first = max(c.original.tokens_per_s for c in verdict.candidates)
            assert verdict.winner.tokens_per_s >= first * 0.9  # (the first, or a tie simpler)
            assert "the time budget ended the repeats" in verdict.text()
            assert outcome.recommendation.label == verdict.winner.label
    assert cut >= 1  # (the case happens in these oracles)


def test_a_search_that_ends_before_its_budget_says_why(tmp_path):
    """A small model's search with ten minutes runs out of moves worth a trial after about
    six: the report's first line and the JSON say how early it ended and why; a search that
    used its budget says nothing of the kind."""
    o = Oracle(53)
    outcome, _, _ = simulate(o, tmp_path / "early", 600.0)
    assert outcome.elapsed_s < 600.0 - 60 and not outcome.out_of_time
    assert outcome.end_note.startswith("ended ") and "before its time budget: " in outcome.end_note
    assert "expected to gain" in outcome.end_note
    assert f"({outcome.end_note})" in report(outcome).splitlines()[0]
    write_json(tmp_path / "early.json", outcome)
    assert json.loads((tmp_path / "early.json").read_text())["end_note"] == outcome.end_note
    used, _, _ = simulate(Oracle(0), tmp_path / "used", FIVE_MINUTES)
    assert used.out_of_time and used.end_note == ""


def test_a_hung_trial_is_stopped_soon_after_the_budgets_end(tmp_path):
    """A trial planned to end within the budget that hangs (these two oracles hang a compiled
    move started at three and four minutes) is stopped OVERRUN_SHARE of the budget past its end,
    not its own expected time past it (59 s and 60 s late before), and the search still answers
    with what ran. Its row says the search stopped it ("timeout"), not that it crashed; a trial
    that hangs earlier, stopped at its own timeout, is a crash."""
    for seed in (22, 997):
        o = Oracle(seed)
        outcome, _, _ = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        hung = [r for r in outcome.results if r.status == "timeout"]
        assert hung, seed  # (the case happens in these oracles)
        assert all(r.message.startswith("stopped at the time budget's end") for r in hung)
        end = max(e["ended_s"] for e in outcome.timeline)
        assert end <= FIVE_MINUTES * (1 + OVERRUN_SHARE) + 1, f"seed {seed}: ended at {end:.0f} s"
        assert outcome.recommendation is not None
    outcome, _, _ = simulate(Oracle(516), tmp_path / "516", FIVE_MINUTES)  # (hangs early too)
    stopped = [r.status for r in outcome.results
               if r.message.startswith((NO_RESULT, "stopped at the time budget's end"))]
    assert stopped == ["crash", "timeout"]


def test_nothing_starts_after_the_time_budget_has_ended(tmp_path):
    """A minute's budget whose baseline hangs (these two oracles, faults drawn often): the
    baseline is stopped GRACE_S past the budget's end and nothing starts after it. Before, the
    fp32 reference runs and the expert's recipe each began after the end and were stopped
    GRACE_S later, for nothing: the searches ended 29 s and 48 s late."""
    for seed in (3041, 3084):
        o = Oracle(seed, fault_rate=0.1)
        outcome, _, clock = simulate(o, tmp_path / str(seed), 60.0)
        assert outcome.results[0].status == "timeout", seed  # (the case happens here)
        assert all(e["started_s"] < 60.0 for e in outcome.timeline), seed
        assert clock.now <= 60.0 + GRACE_S + 1 and outcome.error == ""
        assert outcome.out_of_time


def test_a_move_let_in_on_a_compile_from_the_cache_is_stopped_at_the_budgets_end(tmp_path):
    """Near the end a move outside the compiled answer's graph is let in where its compile from
    the cache fits in the time left; where the cache does not help (warm compiles as long as
    cold), it is stopped GRACE_S past the budget. These four oracles' last moves ran 31-78 s past
    five minutes before."""

    for seed in (133, 234, 249, 278):
        o = Oracle(seed, fault_rate=0.0, warm_share=(1.0, 1.3))
        outcome, _, clock = simulate(o, tmp_path / str(seed), FIVE_MINUTES)
        end = max(e["ended_s"] for e in outcome.timeline)
        assert end <= FIVE_MINUTES + GRACE_S + 5, f"seed {seed}: ended at {end:.0f} s"
        assert outcome.recommendation is not None


def test_the_search_s_progress_count_is_unknown_in_the_opening_then_estimated(tmp_path):
    # (it read "[1/~1", "[2/~2", "[3/~3" through the opening: the count of trials so far)
    printed = io.StringIO()
    simulate(Oracle(0), tmp_path, 300.0, out=printed)
    counts = {}
    for line in printed.getvalue().splitlines():
        found = re.match(r"\[(\d+)/([^ |]+) \| [^]]*; (.*?)\]", line)
        if found and "re-measuring" not in line:
            counts.setdefault(int(found.group(1)), (found.group(2), found.group(3)))
    opening = [total for total, why in counts.values() if why.startswith("the ")]
    moves = [(index, total) for index, (total, why) in counts.items() if why.startswith("move")]
    assert opening and set(opening) == {"?"}
    assert moves and all(re.fullmatch(r"~\d+", total) and int(total[1:]) >= index
                         for index, total in moves)

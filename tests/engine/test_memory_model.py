"""The memory model and the fit-first search: pure parts, no workers."""

from __future__ import annotations

import pytest

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search import History, StagedSearch, default_space
from tuner_tui.engine.search.memory import (
    SKIP_MARGIN, estimate, parameter_count, static_parts,
)

CPU = Capabilities(device="cpu", cuda=False, bf16=True, triton=False)
GPU = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="NVIDIA H200")
MiB = 2**20
N = 10_000_000  # parameters of the pretend model


def _row(config: TuneConfig, peak: int | None, tokens_per_s: float | None = 1.0,
         status: str = "ok", parts: bool = True) -> TrialResult:
    p, g, s = static_parts(config, N)
    return TrialResult(config=config.to_dict(), label=config.label(), status=status,
                       tokens_per_s=tokens_per_s if status == "ok" else None,
                       peak_memory_bytes=peak, loss_ok=True if status == "ok" else None,
                       memory_parts={"parameters": p, "gradients": g, "optimizer_state": s}
                       if parts else {})


def test_static_parts_follow_the_dtypes_of_weights_and_optimizer_state():
    fp32 = TuneConfig.from_dict({})
    assert static_parts(fp32, N) == (4 * N, 4 * N, 8 * N)
    lean = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "optimizer_state": "8bit"})
    assert static_parts(lean, N) == (2 * N, 2 * N, 2 * N)
    assert static_parts(fp32.replace(optimizer_state="offload"), N)[2] == 0
    assert parameter_count([_row(lean, 100 * MiB)]) == N


def test_the_estimate_computes_the_static_parts_and_scales_activations_by_the_micro_batch():
    bf16 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 8})
    measured = [_row(bf16, sum(static_parts(bf16, N)) + 80 * MiB)]  # 10 MiB a sample
    lean = bf16.replace(weights="bf16", optimizer_state="8bit", micro_batch_size=2)
    found = estimate(lean, measured, default_batch=8)
    assert (found.parameters, found.gradients, found.optimizer_state) == (2 * N, 2 * N, 2 * N)
    assert found.activations == 20 * MiB  # two samples at a time
    assert found.total == 6 * N + 20 * MiB
    assert found.basis == bf16.label()
    # A measured checkpointing ratio applies to the activations, not to the whole peak.
    full = bf16.replace(checkpointing="full")
    measured.append(_row(full, sum(static_parts(full, N)) + 20 * MiB))
    found = estimate(lean.replace(checkpointing="full"), measured, 8)
    assert found.activations == 5 * MiB
    assert estimate(lean, [], 8) is None


def test_without_measured_parts_the_whole_peak_scales_as_before():
    bf16 = TuneConfig.from_dict({"precision": "bf16"})
    measured = [_row(bf16, 800 * MiB, parts=False)]
    assert estimate(bf16.replace(batch_size=32), measured, 8).total == 3200 * MiB


def test_the_space_halves_the_micro_batch_down_to_one_and_canonicalises():
    space = default_space(CPU, default_batch=8)
    config = space.start()
    assert space.micro_batches(config) == [0, 4, 2, 1]
    assert space.canonical(config.replace(micro_batch_size=8)).micro_batch_size == 0
    # torch's AdamW implementation flags do nothing where torchao's AdamW steps
    lean = config.replace(optimizer_state="8bit", optimizer="foreach")
    assert space.canonical(lean).optimizer == "plain"
    assert default_space(CPU, 6).micro_batches(config.replace(batch_size=6)) == [0, 3, 1]


def _simulate(space, budget, peak_of, speed_of, limit_rounds=40):
    """Run the staged search against a pretend device: a configuration whose peak exceeds the
    device's memory runs out of memory, one over the budget is measured over it; skipped where
    the driver would skip it (its estimate clearly over the budget)."""
    strategy, history = StagedSearch(space), History(space, budget_bytes=budget)
    tried = []
    for _ in range(limit_rounds):
        batch = strategy.propose(history)
        if not batch:
            break
        for c in batch:
            guess = estimate(c, history.all(), space.default_batch)
            if (guess is not None and guess.certain and guess.total > budget * SKIP_MARGIN
                    and not strategy.must_run(c)):
                history.add(c, TrialResult(config=c.to_dict(), label=c.label(), status="skipped"))
                continue
            tried.append(c)
            history.add(c, _row(c, peak_of(c), speed_of(c)))
    return strategy, history, tried


def test_a_budget_only_full_checkpointing_at_micro_batch_one_meets_is_met_by_it():
    fixed = {"attention": "sdpa", "compile_mode": "off", "optimizer": "plain",
             "weights": "bf16", "precision": "bf16", "optimizer_state": "8bit"}
    space = default_space(CPU, 8, fixed=fixed)
    per_sample = {"off": 40 * MiB, "selective": 30 * MiB, "every-n": 25 * MiB, "full": 10 * MiB}

    def peak(c):
        micro = c.micro_batch_size or 8
        return sum(static_parts(c, N)) + per_sample[c.checkpointing] * micro

    def speed(c):
        return 100 - 10 * ("off", "selective", "every-n", "full").index(c.checkpointing) \
            - 5 * (8 // (c.micro_batch_size or 8))

    budget = 6 * N + 12 * MiB  # only full checkpointing with one sample at a time fits
    strategy, history, tried = _simulate(space, budget, peak, speed)
    best = history.best()
    assert best is not None, "a configuration of the space fits: the search must find it"
    assert (best.config["checkpointing"], best.config["micro_batch_size"]) == ("full", 1)
    assert max(r.peak_memory_bytes for r in history.eligible()) <= budget


def _lever_model():
    """A pretend device: checkpointing saves activations and costs speed, bf16 halves the
    activations and doubles the speed, 8-bit state and micro-batches cost speed."""
    act = {"off": 40 * MiB, "selective": 30 * MiB, "every-n": 25 * MiB, "full": 10 * MiB}

    def peak(c):
        micro = c.micro_batch_size or 8
        scale = 1.0 if c.precision == "fp32" else 0.6
        return sum(static_parts(c, N)) + int(act[c.checkpointing] * micro * scale)

    def speed(c):
        return (200 if c.precision == "bf16" else 100) * (1 - 0.1 * (
            ("off", "selective", "every-n", "full").index(c.checkpointing))) / (
            1 + 0.2 * (8 // (c.micro_batch_size or 8) - 1)) * (
            0.85 if c.optimizer_state == "8bit" else 1.0)

    return peak, speed


def test_when_the_baseline_does_not_fit_the_search_climbs_down_the_ladder_and_back_up():
    space = default_space(CPU, 8, fixed={"attention": "sdpa", "compile_mode": "off",
                                         "optimizer": "plain"})
    peak, speed = _lever_model()
    budget = 6 * N + 8 * 18 * MiB  # bf16 weights, 8-bit state and some checkpointing
    strategy, history, tried = _simulate(space, budget, peak, speed)
    baseline = history.get(space.start())
    assert baseline.peak_memory_bytes > budget
    ladder = strategy.fit_ladder()
    assert tried[1] == ladder[0]  # right after the baseline: the cheapest levers
    assert ladder[0].weights == "bf16" and ladder[0].optimizer_state == "bf16"
    assert ladder[0].checkpointing == "off" and not ladder[0].micro_batch_size
    floor = strategy.floors()[0]
    assert floor == ladder[len(ladder) - len(strategy.floors())]
    assert floor.checkpointing == "full" and floor.micro_batch_size == 1
    assert floor.optimizer_state == "8bit"
    best = history.best()
    assert best is not None and best.peak_memory_bytes <= budget
    # it climbed: a larger micro-batch or lighter checkpointing than the floor's
    assert best.config["micro_batch_size"] != 1 or best.config["checkpointing"] != "full"
    assert best.tokens_per_s > speed(floor)


def test_where_a_cheap_lever_fits_the_ladder_stops_there_without_the_floor():
    space = default_space(CPU, 8, fixed={"attention": "sdpa", "compile_mode": "off",
                                         "optimizer": "plain"})
    peak, speed = _lever_model()
    ladder = StagedSearch(space).fit_ladder()
    selective = next(c for c in ladder if c.checkpointing == "selective")
    assert selective.optimizer_state == "bf16"
    budget = peak(selective)  # bf16 state with selective checkpointing just fits
    strategy, history, tried = _simulate(space, budget, peak, speed)
    assert selective in tried and ladder[0] in tried
    assert not any(c in tried for c in strategy.floors())  # never fell to the slow floor
    best = history.best()
    assert best.peak_memory_bytes <= budget and best.config["optimizer_state"] != "8bit"


@pytest.mark.parametrize("over", [1.10, 1.20])
def test_an_estimate_skips_only_what_is_clearly_over_the_budget(over):
    bf16 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 8})
    static = sum(static_parts(bf16, N))
    measured = [_row(bf16, static + 80 * MiB)]
    budget = int((static + 80 * MiB) / over)
    guess = estimate(bf16.replace(micro_batch_size=8), measured, 8)
    assert (guess.total > budget * SKIP_MARGIN) is (over > SKIP_MARGIN)

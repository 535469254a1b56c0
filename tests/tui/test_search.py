"""The dashboard's greedy search, driven by a table of made-up speeds."""

from __future__ import annotations

from strategies.config import TuneConfig
from tuner_tui.app.search import GreedySearch
from tuner_tui.engine import protocol

from tui_fakes import CPU_CAPS, GPU_CAPS, speed_of


def run(search: GreedySearch, speed=speed_of, fail=lambda c: None, limit: int = 200) -> list[protocol.TrialResult]:
    results: list[protocol.TrialResult] = []
    for _ in range(limit):
        config = search.propose(results)
        if config is None:
            return results
        status = fail(config) or "ok"
        results.append(
            protocol.TrialResult(config=config.to_dict(), label=config.label(), status=status,
                                 tokens_per_s=speed(config.to_dict()), loss_ok=True)
        )
    raise AssertionError("the search did not end")


def test_greedy_search_on_a_gpu_finds_the_best_of_each_option_and_never_repeats():
    search = GreedySearch(TuneConfig(), GPU_CAPS)
    results = run(search)
    best = search.best
    assert best.precision == "fp16" and best.compile_mode != "off" and best.attention == "sdpa"
    assert best.optimizer != "plain" and best.checkpointing == "off"
    configs = [r.config for r in results]
    assert len(configs) == len({str(sorted(c.items())) for c in configs})
    assert configs[0] == TuneConfig().to_dict()


def test_search_skips_what_the_machine_cannot_run_and_what_was_measured():
    baseline = protocol.TrialResult(config=TuneConfig().to_dict(), label="fp32", status="ok", tokens_per_s=10_000.0)
    search = GreedySearch(TuneConfig(), CPU_CAPS)
    proposed = []
    results = [baseline]
    while (config := search.propose(results)) is not None:
        proposed.append(config)
        results.append(protocol.TrialResult(config=config.to_dict(), label="", status="ok",
                                            tokens_per_s=speed_of(config.to_dict()), loss_ok=True))
    assert TuneConfig() not in proposed
    assert all(c.precision in ("fp32", "bf16") and not c.fused_kernels for c in proposed)
    assert all(c.compile_mode in ("off", "default", "max-autotune-no-cudagraphs") for c in proposed)


def test_failures_and_loss_mismatches_never_win():
    def fail(config):
        if config.precision == "fp16":
            return "diverged"
        return None

    search = GreedySearch(TuneConfig(), GPU_CAPS)
    run(search, fail=fail)
    assert search.best.precision == "bf16"


def test_fused_kernels_grow_one_member_at_a_time():
    def speed(config):
        kernels = set(config["fused_kernels"])
        return 1000.0 + 100 * len(kernels & {"layer_norm", "gelu"}) - 50 * len(kernels - {"layer_norm", "gelu"})

    search = GreedySearch(TuneConfig(), GPU_CAPS, options=("fused_kernels",))
    run(search, speed=speed)
    assert set(search.best.fused_kernels) == {"layer_norm", "gelu"}


def test_planned_is_a_useful_estimate_from_the_start():
    search = GreedySearch(TuneConfig(), GPU_CAPS)
    first = search.propose([])
    assert first == TuneConfig() and search.planned > 15

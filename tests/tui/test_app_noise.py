"""On a noisy host the dashboard declares no best and recommends nothing inside the spread: a
search whose rows tie says "tie", and a real run made noisy by an injected sleep measures more
steps, then ties."""

from __future__ import annotations

import pytest

from strategies.config import TuneConfig
from tui_fakes import GPU_CAPS, FakeSampler, FakeWorker, async_test, wait_for
from tuner_tui.app.app import GputuneApp
from tuner_tui.engine.client import WorkerClient
from tuner_tui.engine.noise import ADAPTIVE_FACTOR
from tuner_tui.engine.protocol import WorkerSpec


def _declared_a_best(app) -> list[str]:
    """Every line that names a best: notices and the leaderboard's title."""
    lines = [n.message for n in app._notifications] + [str(app.leaderboard.border_subtitle)]
    return [line for line in lines if "best" in line and "no best" not in line]


@async_test
async def test_a_search_over_rows_within_their_spread_ends_in_a_tie_not_a_best():
    # Every configuration's steps vary by ±80%: the fake's speeds differ by far less than that.
    app = GputuneApp(lambda: FakeWorker(caps=GPU_CAPS, steps=3, spread=0.8),
                     sampler_factory=lambda: FakeSampler(gpu=False))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.search is None, timeout=60)
        over = [n.message for n in app._notifications if n.title == "search over"]
        assert over and "tie:" in over[-1] and "the simpler is kept" in over[-1]
        assert not _declared_a_best(app)
        assert app.leaderboard.standings.best is None
        assert str(app.leaderboard.border_subtitle).startswith("tie:")
        what, exported = app.export_target()
        assert "tie:" in what and exported.measured["verdict"].startswith("tie:")
        assert " more lie within their spread" in exported.measured["verdict"]
        assert exported.measured["noise"].startswith("noisy: steps varied by ±")


@pytest.mark.slow
@async_test
async def test_a_run_made_noisy_by_an_injected_sleep_measures_more_steps_and_ties():
    # Each step sleeps 0-150 ms, several times the step itself (gpt2-tiny on the CPU): the same
    # configuration measured twice must not be told apart from itself.
    spec = WorkerSpec(workload="gpt2-tiny", device="cpu", fault_injection="noisy-steps:150")
    measure = 6
    app = GputuneApp(lambda: WorkerClient(spec), sampler_factory=None, measure_steps=measure)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1, timeout=180)
        app.apply_in_turn([TuneConfig()])
        await wait_for(pilot, lambda: len(app.session.rows) == 2, timeout=180)
        for row in app.session.rows:
            r = row.result
            assert r.status == "ok" and measure < r.measured_steps <= ADAPTIVE_FACTOR * measure + 2
        assert app.leaderboard.standings.best is None and app.leaderboard.standings.is_tie()
        assert not _declared_a_best(app)
        assert "tie:" in app.export_target()[0]
        await pilot.press("q")

"""Dashboard behaviour against a fake worker: fast and deterministic."""

from __future__ import annotations

import pytest

from tui_fakes import FakeSampler, FakeWorker, async_test, wait_for

from tuner_tui.app.app import GputuneApp

SIZE = (160, 50)


def make_app(**kwargs):
    workers: list[FakeWorker] = []
    fake_kwargs = kwargs.pop("fake", {})

    def factory():
        w = FakeWorker(**fake_kwargs)
        workers.append(w)
        return w

    app = GputuneApp(factory, sampler_factory=kwargs.pop("sampler", lambda: FakeSampler(gpu=False)), **kwargs)
    return app, workers


@async_test
async def test_baseline_runs_at_start_and_lands_on_leaderboard():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        row = app.session.rows[0]
        assert row.result.label == "fp32"
        assert app.session.baseline is row
        assert workers[0].commands[0].config["precision"] == "fp32"
        await pilot.press("q")
    assert not workers[0].alive

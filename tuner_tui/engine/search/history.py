"""The history of one search: every trial decided, keyed by configuration, and which of them may
be recommended. Torch-free."""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable

from strategies.config import TuneConfig
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.runner import best
from tuner_tui.engine.search.memory import measured_peak
from tuner_tui.engine.search.space import SearchSpace
from tuner_tui.engine.store import canonical_json


@functools.lru_cache(maxsize=200_000)
def config_key(config: TuneConfig) -> str:
    return canonical_json(config.to_dict())


class History:
    """Every trial of one search, in the order they were decided, keyed by configuration."""

    def __init__(self, space: SearchSpace, budget_bytes: int | None = None) -> None:
        self.space = space
        self.budget_bytes = budget_bytes
        self.results: dict[str, TrialResult] = {}
        self._derived: dict[Hashable, tuple[int, Any]] = {}

    def __contains__(self, config: TuneConfig) -> bool:
        return config_key(config) in self.results

    def __len__(self) -> int:
        return len(self.results)

    def get(self, config: TuneConfig) -> TrialResult | None:
        return self.results.get(config_key(config))

    def add(self, config: TuneConfig, result: TrialResult) -> None:
        self.results[config_key(config)] = result
        self.version += 1

    version = 0
    """Counts the changes, so that what is derived from the trials is computed once each."""

    def derived(self, name: Hashable, build: Callable[[], Any]) -> Any:
        """`build()`, made once per version of the history: what the search reads from the
        trials after each one (the eligible rows, the checks' losses, the memory model's
        trials), asked of every candidate in between."""
        found = self._derived.get(name)
        if found is None or found[0] != self.version:
            found = self._derived[name] = (self.version, build())
        return found[1]

    def all(self) -> list[TrialResult]:
        return list(self.results.values())

    def eligible(self) -> list[TrialResult]:
        """Trials that may be recommended: ran, kept the loss, lie in the space, and stayed
        within the memory budget (a stored trial may come from a search with a larger one)."""
        return list(self.derived("eligible", lambda: [
            r for r in self.results.values()
            if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False
            and self.space.contains(r.tune_config)
            and (self.budget_bytes is None or (measured_peak(r) or 0) <= self.budget_bytes)
        ]))

    def best(self) -> TrialResult | None:
        return best(self.eligible())

    def fits(self, result: TrialResult) -> bool:
        """False when the trial ran out of memory, was skipped as over the memory budget, or
        measured a peak over it; other failures are not a matter of memory."""
        if result.status in ("oom", "skipped"):
            return False
        peak = measured_peak(result)
        return self.budget_bytes is None or peak is None or peak <= self.budget_bytes

"""The chance that a configuration fits the memory budget, from the memory model's estimate
(`memory.estimate`) and how far such estimates are known to miss: within about 7% where every
option's effect was measured here (`certain`), about 20% where a prior from the model's shapes
stands in. Torch-free."""

from __future__ import annotations

import math

from strategies.config import TuneConfig
from tuner_tui.engine.search.history import History, config_key
from tuner_tui.engine.search.memory import MemoryEstimate, estimate

CERTAIN_SD = 0.07
UNCERTAIN_SD = 0.20


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


class Footprint:
    """Estimates of the peak for one search, kept until a new trial is measured."""

    def __init__(self, history: History, default_batch: int, budget_bytes: int | None) -> None:
        self.history = history
        self.default_batch = default_batch
        self.budget_bytes = budget_bytes
        self._cache: dict[str, MemoryEstimate | None] = {}
        self._version = -1

    def estimate(self, config: TuneConfig) -> MemoryEstimate | None:
        if self._version != len(self.history):
            self._cache.clear()
            self._version = len(self.history)
        key = config_key(config)
        if key not in self._cache:
            try:
                self._cache[key] = estimate(config, self.history.all(), self.default_batch)
            except Exception:  # an estimate that cannot be made says nothing, never stops a search
                self._cache[key] = None
        return self._cache[key]

    def chance_to_fit(self, config: TuneConfig) -> float:
        """1 without a budget; 0.5 where nothing is known yet."""
        if self.budget_bytes is None:
            return 1.0
        found = self.estimate(config)
        if found is None or found.total <= 0:
            return 0.5
        sd = (CERTAIN_SD if found.certain else UNCERTAIN_SD) * found.total
        return normal_cdf((self.budget_bytes - found.total) / sd)

    def bytes(self, config: TuneConfig) -> int | None:
        found = self.estimate(config)
        return found.total if found is not None else None

"""The dashboard's automatic search (key t): `gputune tune`'s search strategy on the live run.

The space, the stages and the choice of the best are the engine's (`tuner_tui.engine.search`:
`default_space`, `StagedSearch`, `History`), so the dashboard and `gputune tune` search the same
way. What differs is where a trial runs: here each proposal is an ApplyConfig to the dashboard's
worker, and its leaderboard row is the result. Rows measured before the search (by hand) count
as trials already done. Torch-free; the engine's search module is imported when a search starts.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine.protocol import TrialResult


class LiveSearch:
    """Feed it every result so far; it answers with the next configuration to apply, or None
    when the search is over (then `best` is the winner)."""

    def __init__(
        self,
        capabilities: Capabilities,
        default_batch: int,
        strategy_factory: Callable[[Any], Any] | None = None,
    ) -> None:
        from tuner_tui.engine import search as engine

        self._engine = engine
        self.space = engine.default_space(capabilities, default_batch)
        self.history = engine.History(self.space)
        self.strategy = (strategy_factory or engine.StagedSearch)(self.space)
        self.tried: list[TuneConfig] = []
        """Configurations proposed, in order."""
        self._round: list[TuneConfig] = []

    def _absorb(self, results: Iterable[TrialResult]) -> None:
        for result in results:
            try:
                config = self.space.canonical(result.tune_config)
            except ConfigError:
                continue
            if result.status == "crash" and config in self.history:
                continue  # keep what it measured before the worker died
            self.history.add(config, result)

    def propose(self, results: Iterable[TrialResult]) -> TuneConfig | None:
        self._absorb(results)
        while True:
            while self._round:
                config = self._round.pop(0)
                if config not in self.history:
                    self.tried.append(config)
                    return config
            self._round = list(self.strategy.propose(self.history))
            if not self._round:
                return None

    @property
    def best(self) -> TuneConfig | None:
        result = self.history.best()
        return result.tune_config if result is not None else None

    @property
    def best_tokens(self) -> float:
        result = self.history.best()
        return float(result.tokens_per_s or 0.0) if result is not None else 0.0

    @property
    def current(self) -> str:
        """The stage being searched, for the progress line."""
        name = getattr(self.strategy, "stage_name", None)
        return name() if callable(name) else ""

    @property
    def planned(self) -> int:
        """A rough total for the progress line: tried, queued, and the strategy's estimate."""
        return len(self.tried) + len(self._round) + int(self.strategy.remaining(self.history))

"""The dashboard's automatic search (key t): `gputune tune`'s search strategy on the live run.

The space, the strategy and the choice of the best are the engine's (`tuner_tui.engine.search`:
`default_space`, `AnytimeSearch`, `History`), so the dashboard and `gputune tune` search the same
way: the baseline, the expert's recipe, then the move expected to gain the most per second,
until none is expected to gain more than a fraction of a percent. What differs is where a trial runs: here each proposal is an ApplyConfig to the dashboard's
worker, and its leaderboard row is the result. Rows measured before the search (by hand) count
as trials already done. Torch-free; the engine's search module is imported when a search starts.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from strategies.applicability import inapplicable_options, training_changing_options
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
        workload: Mapping[str, Any] | None = None,
    ) -> None:
        """`workload`: the worker's description of it (`WorkerReady.workload`), whose options
        that change nothing, or would train the model differently, are not searched."""
        from tuner_tui.engine import search as engine
        from tuner_tui.engine.search.priors import Context

        self._engine = engine
        self.space = engine.default_space(
            capabilities, default_batch, inapplicable=inapplicable_options(workload),
            changes_training=training_changing_options(workload))
        self.history = engine.History(self.space)
        self.strategy = (strategy_factory or (lambda space: engine.AnytimeSearch(
            space, Context(capabilities.device, False, default_batch))))(self.space)
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
            known = self.history.get(config)
            if known is result or (known is not None and known.to_dict() == result.to_dict()):
                continue
            self.history.add(config, result)
            observe = getattr(self.strategy, "observe", None)
            if observe is not None:  # the anytime search learns from every row (no wall time here)
                observe(config, result, 0.0, self.history)

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
        """Why the configuration under way was proposed, for the progress line."""
        last = getattr(self.strategy, "last", None)
        return last.why if last is not None else ""

    @property
    def planned(self) -> int | None:
        """A rough total for the progress line: tried, queued, and the strategy's estimate;
        None while the strategy cannot tell (its opening), as `gputune tune` shows it."""
        remaining = self.strategy.remaining(self.history)
        if remaining is None:
            return None
        return len(self.tried) + len(self._round) + int(remaining)

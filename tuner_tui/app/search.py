"""The dashboard's automatic search: a greedy walk over the registry's options on the live run.

Option by option (in registry order, which is the composition order), every value this machine
can run is tried on top of the best configuration so far; the fastest run that kept the loss
wins and the walk moves to the next option. Set options (fused kernels) grow one member at a time.
Numeric options are left as they are, and so are options that trade speed for memory.
Configurations already measured this session are not run again. Pure and torch-free: the app
feeds it results and applies what it proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from strategies.config import ConfigError, TuneConfig
from strategies.registry import OPTIONS, Capabilities, Option, option_unavailable
from tuner_tui.engine.protocol import TrialResult

MEMORY_OPTIONS = ("checkpointing", "checkpoint_every")
"""Recomputing activations saves memory and never makes a step faster: not searched."""


def searchable(option: Option) -> bool:
    return option.kind in ("choice", "bool", "set") and option.key not in MEMORY_OPTIONS


def _key(config: TuneConfig) -> tuple:
    return config.values


def good(result: TrialResult) -> bool:
    """A run the search may pick: it ran, it was measured, and its loss kept to the reference."""
    return result.status == "ok" and bool(result.tokens_per_s) and result.loss_ok is not False


@dataclass
class GreedySearch:
    start: TuneConfig
    capabilities: Capabilities
    options: tuple[str, ...] = tuple(k for k, o in OPTIONS.items() if searchable(o))
    best: TuneConfig | None = None
    best_tokens: float = 0.0
    tried: list[TuneConfig] = field(default_factory=list)
    """Configurations proposed, in order."""
    current: str | None = None
    """The option being searched."""
    _option_index: int = -1
    _candidates: list[TuneConfig] = field(default_factory=list)
    _round_base: TuneConfig | None = None
    _started: bool = False

    def _runnable(self, config: TuneConfig) -> bool:
        return all(
            option_unavailable(OPTIONS[k], v, self.capabilities) is None for k, v in config.values
        )

    def _candidates_for(self, key: str, base: TuneConfig) -> list[TuneConfig]:
        option = OPTIONS[key]
        if option.kind == "set":
            present = tuple(getattr(base, key))
            values = [present + (c,) for c in option.choices if c not in present]
        elif option.kind == "bool":
            values = [not getattr(base, key)]
        else:
            values = [c for c in option.choices if c != getattr(base, key)]
        out = []
        for value in values:
            try:
                config = base.replace(**{key: value})
            except ConfigError:
                continue  # an invalid combination (e.g. fullgraph without compile)
            if self._runnable(config):
                out.append(config)
        return out

    def _absorb(self, results: Iterable[TrialResult]) -> dict[tuple, TrialResult]:
        """Latest result per configuration; updates the best."""
        by_config: dict[tuple, TrialResult] = {}
        for r in results:
            try:
                config = TuneConfig.from_dict(r.config)
            except ConfigError:
                continue
            by_config[_key(config)] = r
            if good(r) and r.tokens_per_s > self.best_tokens:
                self.best, self.best_tokens = config, float(r.tokens_per_s)
        return by_config

    def propose(self, results: Iterable[TrialResult]) -> TuneConfig | None:
        """The next configuration to measure, or None when the search is over (see `best`).
        Call it with every result so far, each time the previous proposal has its result."""
        measured = self._absorb(results)
        if not self._started:
            self._started = True
            if _key(self.start) not in measured:
                self.tried.append(self.start)
                return self.start
        while True:
            while self._candidates:
                candidate = self._candidates.pop(0)
                if _key(candidate) not in measured and candidate not in self.tried:
                    self.tried.append(candidate)
                    return candidate
            base = self.best or self.start
            if self.current and OPTIONS[self.current].kind == "set" and base != self._round_base:
                # A member joined the set: try adding one more on top of it.
                self._round_base = base
                self._candidates = self._candidates_for(self.current, base)
                continue
            self._option_index += 1
            if self._option_index >= len(self.options):
                self.current = None
                return None
            self.current = self.options[self._option_index]
            self._round_base = base
            self._candidates = self._candidates_for(self.current, base)

    @property
    def planned(self) -> int:
        """A rough total for the progress line: what was tried, what is queued, and one round
        of each option still to come (on today's best)."""
        base = self.best or self.start
        later = self.options[self._option_index + 1 :]
        return len(self.tried) + len(self._candidates) + sum(len(self._candidates_for(k, base)) for k in later)

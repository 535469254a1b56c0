"""The single moves from a configuration that depend on the search space alone: one option to
another of its values (with the options it interacts with), the batch doubled or halved or
accumulated to four to sixteen times, the micro-batch a step smaller or larger; and what tells
two configurations apart. The anytime search (`anytime.py`) predicts and weighs them.
Torch-free."""

from __future__ import annotations

from strategies.config import TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.search.expert import variant
from tuner_tui.engine.search.space import SearchSpace


class SingleMoves:
    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._found: dict[TuneConfig, list[tuple[tuple[str, ...], TuneConfig]]] = {}

    def singles(self, config: TuneConfig) -> list[tuple[tuple[str, ...], TuneConfig]]:
        """The moves from `config`, each with the options it changes (kept per configuration:
        the search asks for the same parents' moves at every trial)."""
        found = self._found.get(config)
        if found is None:
            found = self._found[config] = self._single_moves(config)
        return found

    def _single_moves(self, config: TuneConfig) -> list[tuple[tuple[str, ...], TuneConfig]]:
        singles: list[tuple[tuple[str, ...], TuneConfig]] = []
        for key, values in self.space.choices:
            if key in ("batch_size", "micro_batch_size"):
                continue
            if key == "compile_scope" and config.compile_mode == "off":
                continue
            for value in values:
                child = variant(self.space, config, **{key: value})
                if child is not None and child != config:
                    singles.append(((key,), child))
                    for other in OPTIONS[key].search.interacts:
                        for partner in self.space.values(other):
                            both = variant(self.space, child, **{other: partner})
                            if both is not None and both != child and both != config:
                                singles.append(((key, other), both))
        for child in self.batch_moves(config):
            singles.append((("batch_size",), child))
        sizes = self.space.micro_batches(config)
        current = config.micro_batch_size
        if current in sizes:
            at = sizes.index(current)
            for other in sizes[max(0, at - 1):at] + sizes[at + 1:at + 2]:
                child = variant(self.space, config, micro_batch_size=other)
                if child is not None and child != config:
                    singles.append((("micro_batch_size",), child))
        return singles

    def batch_moves(self, config: TuneConfig) -> list[TuneConfig]:
        """The batch doubled or halved, and four to sixteen times it accumulated from the same
        micro-batch."""
        if "batch_size" not in dict(self.space.choices):
            return []
        batch = config.batch_size or self.space.default_batch
        found = []
        for size in (batch * 2, batch // 2):
            if size < 1:
                continue
            child = variant(self.space, config, batch_size=size)
            if child is not None and child != config and self.space.contains(child):
                found.append(child)
        micro = config.micro_batch_size or self.space.rank_batch(config)
        for size in (batch * 4, batch * 8, batch * 16):
            child = variant(self.space, config, batch_size=size, micro_batch_size=micro)
            if child is not None and child != config and self.space.contains(child):
                found.append(child)
        return found


def accumulated(space: SearchSpace, config: TuneConfig) -> int:
    """How many micro-batches one optimizer step accumulates."""
    batch = space.rank_batch(config)
    return batch // max(1, config.micro_batch_size or batch)


def options_moved(a: TuneConfig, b: TuneConfig) -> tuple[str, ...]:
    """The options in which `b` differs from `a`, in the registry's order."""
    return a.differing(b)


def show(config: TuneConfig, key: str) -> str:
    value = config[key]
    if isinstance(value, (list, tuple)):
        return "+".join(value) or "none"
    return OPTIONS[key].show(value)


__all__ = ["SingleMoves", "accumulated", "options_moved", "show"]

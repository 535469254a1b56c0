"""The recipe an expert would write for this machine and model, measured right after the
baseline: every speed lever at the value its prior expects the most of (on a GPU: bf16, SDPA,
torch.compile, fused AdamW, the fused linear + cross-entropy; bf16 weights on a large model),
made to fit the memory budget by the memory levers that free the most memory for the least
speed, and at the largest batch the memory model says fits comfortably (where the batch is
searched). From it on, the search holds a recommendation at least this good. Torch-free."""

from __future__ import annotations

import functools
import heapq
import itertools
from typing import Iterator

from strategies.config import ConfigError, TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.search.fit import Footprint
from tuner_tui.engine.search.priors import Context, move_prior
from tuner_tui.engine.search.space import SearchSpace

FIT_SHARE = 0.9
"""The recipe is made to fit in this share of the budget (the estimate may miss by a little)."""
FIT_LEVERS = 4
"""At most this many memory levers are added to fit."""
FIT_NODES = 400
"""... and at most this many configurations are estimated on the way."""
MIN_LOSS = 0.005
"""A lever expected to cost nothing (or to pay) still counts this much: fewer changes first."""
GROW_SHARE = 0.7
"""The batch is doubled while the estimate stays within this share of the budget ..."""
GROW_DOUBLINGS = 2
"""... at most this many times: past a few doublings a larger batch buys little speed."""
MOVED_FIRST = ("compile_mode",)
"""Decided first: what pays beside it (kernels, attention) depends on whether it compiles."""


def variant(space: SearchSpace, config: TuneConfig, **changes) -> TuneConfig | None:
    """`config` with `changes`, as the space puts it; None where the rules refuse it."""
    try:
        return _variant(space, config, tuple(sorted(changes.items())))
    except TypeError:  # a value that cannot be a key (a list): not cached
        return _make_variant(space, config, changes)


@functools.lru_cache(maxsize=200_000)
def _variant(space: SearchSpace, config: TuneConfig, changes: tuple) -> TuneConfig | None:
    return _make_variant(space, config, dict(changes))


def _make_variant(space: SearchSpace, config: TuneConfig, changes: dict) -> TuneConfig | None:
    try:
        return space.canonical(config.replace(**changes))
    except ConfigError:
        return None


COMPILE_KEYS = ("compile_mode", "compile_scope")


def speed_recipe(space: SearchSpace, ctx: Context, start: TuneConfig,
                 held: tuple[str, ...] = ()) -> TuneConfig:
    """Each searched speed lever (but those `held` at the start's value) at the value whose
    prior mean is highest, in turn."""
    keys = [k for k, _ in space.choices if OPTIONS[k].search.lever in ("speed", "both")
            and k not in ("batch_size", "micro_batch_size") + held]
    keys.sort(key=lambda k: k not in MOVED_FIRST)
    config = start
    for key in keys:
        best, gain = config, 0.0
        for value in space.values(key):
            child = variant(space, config, **{key: value})
            if child is None or child == config:
                continue
            mean = move_prior(key, config, child, ctx).mean
            if mean > gain:
                best, gain = child, mean
        config = best
    return config


def memory_moves(space: SearchSpace, config: TuneConfig) -> Iterator[tuple[str, TuneConfig]]:
    """Single changes of the options that free memory (the memory levers, the micro-batch one
    step smaller)."""
    for key, values in space.choices:
        if OPTIONS[key].search.lever not in ("memory", "both", "parallel") or key in (
                "batch_size", "micro_batch_size"):
            continue
        for value in values:
            child = variant(space, config, **{key: value})
            if child is not None and child != config:
                yield key, child
    smaller = [m for m in space.micro_batches(config) if m]
    current = config.micro_batch_size or space.rank_batch(config)
    below = [m for m in smaller if m < current]
    if below:
        child = variant(space, config, micro_batch_size=max(below))
        if child is not None and child != config:
            yield "micro_batch_size", child


def fit(space: SearchSpace, ctx: Context, footprint: Footprint, config: TuneConfig,
        budget: int, share: float = FIT_SHARE) -> TuneConfig:
    """`config` with the memory levers that bring its estimate within `share` of the budget for
    the least speed lost in all (their prior losses summed): a uniform-cost search over sets of
    up to FIT_LEVERS levers, so that bf16 optimizer state and one smaller micro-batch (-6%) win
    over full checkpointing (-17%) that closes the gap alone. Where no set fits, the set that
    frees the most."""
    peak = footprint.bytes(config)
    if peak is None or peak <= budget * share:
        return config
    frontier = [(0.0, 0, config)]
    seen = {config}
    leanest, leanest_peak = config, peak
    order = itertools.count(1)  # ties in loss: the first reached first
    while frontier and len(seen) < FIT_NODES:
        lost, _, at = heapq.heappop(frontier)
        at_peak = footprint.bytes(at)
        if at_peak is not None and at_peak <= budget * share:
            return at
        if at_peak is not None and at_peak < leanest_peak:
            leanest, leanest_peak = at, at_peak
        if _levers(config, at) >= FIT_LEVERS:
            continue
        for key, child in memory_moves(space, at):
            if child in seen:
                continue
            seen.add(child)
            after = footprint.bytes(child)
            if after is None or at_peak is None or after >= at_peak:
                continue
            loss = max(MIN_LOSS, -move_prior(key, at, child, ctx).mean)
            heapq.heappush(frontier, (lost + loss, next(order), child))
    return leanest


def _levers(start: TuneConfig, config: TuneConfig) -> int:
    return sum(1 for key, value in start.values if config[key] != value)


def grow(space: SearchSpace, footprint: Footprint, config: TuneConfig, budget: int) -> TuneConfig:
    """Doublings of the batch while the estimate stays within GROW_SHARE of the budget."""
    if "batch_size" not in dict(space.choices):
        return config
    for _ in range(GROW_DOUBLINGS):
        batch = config.batch_size or space.default_batch
        child = variant(space, config, batch_size=batch * 2)
        if child is None or not space.contains(child):
            break
        peak = footprint.bytes(child)
        if peak is None or peak > budget * GROW_SHARE:
            break
        config = child
    return config


def expert_recipe(space: SearchSpace, ctx: Context, footprint: Footprint,
                  budget: int | None, eager: bool = False, grow_batch: bool = True) -> TuneConfig:
    """The recipe; `eager`: the best one without torch.compile (what pays beside it chosen for
    eager execution), measured first where the compiled recipe's trial would take much of the
    time left; `grow_batch`: False keeps the run's batch."""
    config = speed_recipe(space, ctx, space.start(), held=COMPILE_KEYS if eager else ())
    if budget is not None:
        config = fit(space, ctx, footprint, config, budget)
        if grow_batch:
            config = grow(space, footprint, config, budget)
    return config

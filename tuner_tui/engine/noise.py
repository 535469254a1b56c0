"""How much a measurement can be trusted: the spread of a row's step times, when it is too large
to rank by, and when two rows differ by less than their spread (a tie). Torch-free: the
worker, the commands and the dashboard all use it."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from strategies.config import TuneConfig
from tuner_tui import format as fmt
from tuner_tui.engine.protocol import TrialResult

NOISY_SPREAD = 0.05
"""A row whose step times' half interquartile range exceeds 5% of the median is called noisy.
On a quiet GPU the steps of one configuration vary by well under 1-2% (CUDA events, a fixed
graph); the differences a search acts on (a kernel, a compile mode) are often 3-10%, so at ±5%
the ranking of neighbouring rows is no longer what the figures say. A busy host (another
process on the cores that launch the kernels) or a throttling GPU is the usual cause."""


def quartiles(times: Sequence[float]) -> tuple[float, float]:
    """First and third quartiles of the step times (both the value itself for one step)."""
    if len(times) < 2:
        return (times[0], times[0]) if times else (math.nan, math.nan)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3


def spread(result: TrialResult) -> float | None:
    """Half the interquartile range of the step time, relative to the median: "±x%"."""
    if not result.step_ms or result.step_ms_q1 is None or result.step_ms_q3 is None:
        return None
    return (result.step_ms_q3 - result.step_ms_q1) / 2 / result.step_ms


def spread_text(result: TrialResult) -> str:
    s = spread(result)
    return "-" if s is None else fmt.spread(s)


def is_noisy(result: TrialResult) -> bool:
    s = spread(result)
    return s is not None and s > NOISY_SPREAD


def noise_warning(result: TrialResult) -> str:
    """The words the reports and the dashboard use for a noisy row ("" when it is not)."""
    if not is_noisy(result):
        return ""
    return (f"noisy: steps varied by ±{spread(result):.1%}; a busy host or thermal "
            "throttling?")


def noise_lines(results: Sequence[TrialResult]) -> list[str]:
    """One line per noisy row of a table, numbered as the table numbers them."""
    return [f"row {i} ({r.label}): {noise_warning(r)}"
            for i, r in enumerate(results, start=1) if r.status == "ok" and is_noisy(r)]


def tie_gap(a: float, b: float) -> float:
    """The smallest relative difference that is not a tie between two figures with relative
    spreads a and b (independent errors add in quadrature)."""
    return math.hypot(a, b)


def tied_at_top(results: Sequence[TrialResult]) -> list[TrialResult]:
    """The results (measured, each with a rate) within the combined spread of the fastest
    (`tie_gap`), fastest first: the fastest alone where its lead is larger than the noise."""
    ranked = sorted(results, key=lambda r: r.tokens_per_s, reverse=True)
    if not ranked:
        return []
    top = ranked[0]
    return [r for r in ranked if r is top or top.tokens_per_s / r.tokens_per_s - 1
            <= tie_gap(spread(top) or 0.0, spread(r) or 0.0)]


def simplest(results: Sequence[TrialResult]) -> TrialResult:
    """Of a tie, the configuration to keep: the fewest options changed, then the least memory
    (`simplicity`), then the fastest."""
    return min(results, key=lambda r: (simplicity(r.config, r.peak_memory_bytes),
                                       -(r.tokens_per_s or 0.0)))


def simplicity(config: dict, peak_memory_bytes: int | None) -> tuple:
    """Sort key: fewer options changed from the defaults first, then less peak memory."""
    changed = TuneConfig.from_dict(config).changed()
    return (len(changed), peak_memory_bytes if peak_memory_bytes is not None else math.inf)


# -- measuring until the spread allows a ranking (the worker) ------------------------------------

ADAPTIVE_FACTOR = 3
"""A measurement whose spread is over NOISY_SPREAD after its planned steps goes on, up to this
many times as many steps, until the spread falls under it (torch.utils.benchmark's
`adaptive_autorange` does the same with its blocks). A burst of load from a neighbour is then
outvoted by the quiet steps around it; a host that stays busy keeps the row noisy, and it is
reported so after the cap."""
STOP_MIN_STEPS = 5
"""An early stop looks at no fewer measured steps than this: one slow reading is not a trend."""


def times_spread(times: Sequence[float]) -> float | None:
    """`spread` of raw step times: half their interquartile range over their median."""
    if not times:
        return None
    median = statistics.median(times)
    if median <= 0:
        return None
    q1, q3 = quartiles(times)
    return (q3 - q1) / 2 / median


def adaptive_cap(steps: int, max_steps: int | None = None) -> int:
    """The most measured steps a noisy measurement may take: `max_steps`, or ADAPTIVE_FACTOR x
    the planned `steps`; never fewer than `steps`."""
    cap = ADAPTIVE_FACTOR * steps if max_steps is None else max_steps
    return max(steps, cap)


def settled(times: Sequence[float]) -> bool:
    """Whether these step times are steady enough to rank by (spread within NOISY_SPREAD)."""
    s = times_spread(times)
    return s is None or s <= NOISY_SPREAD


def clearly_slower(times: Sequence[float], threshold_ms: float, reference_spread: float = 0.0,
                   min_steps: int = STOP_MIN_STEPS) -> bool:
    """The early stop's test: over at least `min_steps` (and STOP_MIN_STEPS) measured steps,
    even the faster quartile of `times` is slower than `threshold_ms` (the stop line) by
    more than the two spreads combined (`tie_gap`). A median of three readings, one of them a
    hiccup, is not enough: a noisy host then stops configurations as fast as the best."""
    if len(times) < max(min_steps, STOP_MIN_STEPS) or threshold_ms <= 0:
        return False
    q1, _ = quartiles(times)
    own = times_spread(times) or 0.0
    return q1 > threshold_ms * (1 + tie_gap(own, reference_spread or 0.0))

"""Which leaderboard row leads, and only when its lead is larger than the noise.

A row is "best" only when it is faster than every other row by more than their spreads combined
(`noise.tie_gap`); rows within that of the fastest are a tie, won by the simpler configuration
(`noise.simplicity`), as `gputune tune` decides ties. The leaderboard's title, its marks, the
search's messages and `e` (export) all read this one answer. Plain data, no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner_tui import format as fmt
from tuner_tui.app.session import Row
from tuner_tui.engine.noise import simplicity, spread, tie_gap, tied_at_top


def eligible(row: Row) -> bool:
    """Ran, measured a rate, passed the loss and gradient checks."""
    r = row.result
    return r.status == "ok" and bool(r.tokens_per_s) and r.loss_ok is not False


def _spread(row: Row) -> float:
    return spread(row.result) or 0.0


def _simpler(row: Row) -> tuple:
    try:
        return simplicity(row.result.config, row.result.peak_memory_bytes)
    except Exception:  # noqa: BLE001 - a stored configuration this version no longer reads
        return (float("inf"), float("inf"))


@dataclass(frozen=True)
class Standing:
    """The rows' order as far as the noise allows."""

    fastest: Row | None = None
    """The row with the highest rate, whatever its lead."""
    tied: tuple[Row, ...] = ()
    """The rows within the combined spread of the fastest, the fastest first, when there are
    two or more: none of them is "best"."""
    runner_up: Row | None = None
    """The next fastest row after `fastest`."""
    count: int = 0
    """How many rows are eligible."""

    @property
    def best(self) -> Row | None:
        """The fastest row when its lead over every other is larger than the noise; else None."""
        return self.fastest if self.fastest is not None and not self.tied and self.count > 1 else None

    @property
    def pick(self) -> Row | None:
        """What to recommend: the best, or of a tie the simplest (fewest options changed, then
        the least memory); with a single row, that row."""
        if self.tied:
            return min(self.tied, key=_simpler)
        return self.fastest

    @property
    def lead(self) -> float | None:
        """The fastest row's rate over the runner-up's, less one (0.2: 20% faster)."""
        if self.fastest is None or self.runner_up is None:
            return None
        return self.fastest.result.tokens_per_s / self.runner_up.result.tokens_per_s - 1

    def is_tie(self) -> bool:
        return bool(self.tied)

    def text(self, item_name: str = "tokens") -> str:
        """One line for the leaderboard's title (empty until two rows can be compared)."""
        if self.count < 2 or self.fastest is None:
            return ""
        if self.tied:
            numbers = ", ".join(f"#{r.number}" for r in self.tied[:4]) + (
                f" and {len(self.tied) - 4} more" if len(self.tied) > 4 else "")
            gap = max(tie_gap(_spread(self.tied[0]), _spread(r)) for r in self.tied[1:])
            pick = self.pick
            return f"tie: {numbers} within the spread (±{gap:.0%}); the simpler is #{pick.number}"
        best, other = self.fastest, self.runner_up
        gap = tie_gap(_spread(best), _spread(other))
        return (f"best: #{best.number} {fmt.rate(best.result.tokens_per_s)} {item_name}/s, "
                f"{self.lead:.0%} ahead of #{other.number} (spread ±{gap:.1%})")

    def mark(self, row: Row) -> str:
        """The mark beside a row's number: ★ the best, = one of a tie at the top."""
        if self.best is row:
            return "★"
        if row in self.tied:
            return "="
        return ""


def standing(rows: list[Row]) -> Standing:
    ranked = sorted((r for r in rows if eligible(r)), key=lambda r: r.result.tokens_per_s,
                    reverse=True)
    if not ranked:
        return Standing()
    fastest = ranked[0]
    at_top = {id(r) for r in tied_at_top([r.result for r in ranked])}
    tied = tuple(r for r in ranked if id(r.result) in at_top)
    return Standing(fastest=fastest, tied=tied if len(tied) > 1 else (),
                    runner_up=ranked[1] if len(ranked) > 1 else None, count=len(ranked))

"""A line plot of one series over the session's steps, drawn in braille, with configuration
changes marked. Used for the rate (tokens/s, images/s), step time and loss. The axis spans the
steady steps: the first step (torch.compile's) and the warm-up are drawn dimmed, as are points
beyond the axis (at its edge), so one spike does not flatten the rest."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

_BRAILLE_BASE = 0x2800
# Bit of each dot in a braille cell, indexed [row][column] (rows top to bottom).
_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


def bucket(values: Sequence[float], columns: int,
           steady: Sequence[bool] | None = None) -> tuple[list[float], list[bool]]:
    """`values` squeezed to at most `columns` points (the mean of each bucket, NaNs skipped; of
    its steady values where it has any), with whether each point is steady."""
    steady = list(steady) if steady is not None else [True] * len(values)
    n = len(values)
    if n <= columns:
        return list(values), steady[:n]
    points, flags = [], []
    for c in range(columns):
        lo, hi = c * n // columns, (c + 1) * n // columns
        chunk = [(v, s) for v, s in zip(values[lo:hi], steady[lo:hi]) if not math.isnan(v)]
        calm = [v for v, s in chunk if s]
        use = calm or [v for v, _ in chunk]
        points.append(sum(use) / len(use) if use else math.nan)
        flags.append(bool(calm))
    return points, flags


def value_range(values: Sequence[float], zero_based: bool,
                steady: Sequence[bool] | None = None) -> tuple[float, float]:
    """The axis: the span of the steady values (all values where none is steady), padded; the
    first step and the warm-up do not drive it."""
    finite = [v for v in values if math.isfinite(v)]
    if steady is not None:
        calm = [v for v, s in zip(values, steady) if s and math.isfinite(v)]
        finite = calm or finite
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if zero_based:
        lo = min(lo, 0.0)
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    else:
        pad = (hi - lo) * 0.05
        hi += pad
        lo = lo if zero_based else lo - pad
    return lo, hi


def braille_lines(
    values: Sequence[float], width: int, height: int, lo: float, hi: float
) -> tuple[list[list[int]], set[tuple[int, int]]]:
    """Dot masks, `height` rows of `width` cells; each point is one dot column, joined to the
    previous point by a vertical run so the line stays continuous. Points off the axis are
    drawn at its edge; the cells holding them are returned apart (row, column)."""
    cells = [[0] * width for _ in range(height)]
    clipped: set[tuple[int, int]] = set()
    rows = height * 4
    previous: int | None = None
    for x, value in enumerate(values[: width * 2]):
        if not math.isfinite(value):
            previous = None
            continue
        exact = round((hi - value) / (hi - lo) * (rows - 1))
        y = min(rows - 1, max(0, exact))
        if y != exact:
            clipped.add((y // 4, x // 2))
        top, bottom = (y, y) if previous is None else (min(y, previous), max(y, previous))
        for dot_row in range(top, bottom + 1):
            cells[dot_row // 4][x // 2] |= _DOT_BITS[dot_row % 4][x % 2]
        previous = y
    return cells, clipped


class TimeSeriesPlot(Widget):
    """Plots `values` (one per step) and a mark at each configuration change."""

    DEFAULT_CSS = """
    TimeSeriesPlot {
        height: 1fr;
        min-height: 4;
    }
    """

    GUTTER = 8

    version: reactive[int] = reactive(0)
    """Bumped by `set_data`; a change redraws the plot."""

    def __init__(
        self,
        title: str,
        formatter: Callable[[float | None], str],
        *,
        zero_based: bool = True,
        color: str = "green",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.formatter = formatter
        self.zero_based = zero_based
        self.color = color
        self._values: list[float] = []
        self._steady: list[bool] = []
        self._markers: list[tuple[int, int]] = []
        self.border_title = title

    def set_data(self, values: Sequence[float], markers: Sequence[tuple[int, int]],
                 steady: Sequence[bool] | None = None) -> None:
        """`markers` are (index into values, run number) pairs; `steady` marks the values that
        set the scale (not the first step nor the warm-up), all when None."""
        self._values = list(values)
        self._steady = list(steady) if steady is not None else [True] * len(self._values)
        self._markers = list(markers)
        latest = next((v for v in reversed(self._values) if math.isfinite(v)), None)
        self.border_title = f"{self.title}  {self.formatter(latest)}"
        self.version += 1

    def render(self) -> Text:
        width = max(1, self.size.width - self.GUTTER)
        height = max(1, self.size.height)
        text = Text(no_wrap=True, overflow="crop")
        if not self._values:
            text.append("waiting for the first steps…", style="dim")
            return text
        points, steady = bucket(self._values, width * 2, self._steady)
        n = len(self._values)
        lo, hi = value_range(points, self.zero_based, steady)
        cells, clipped = braille_lines(points, width, height, lo, hi)
        unsteady = {x // 2 for x, s in enumerate(steady[: width * 2]) if not s}
        marker_cells: dict[int, int] = {}
        for index, number in self._markers:
            x = index if n <= width * 2 else index * (width * 2) // n
            marker_cells[min(width - 1, x // 2)] = number
        for row in range(height):
            if row == 0:
                label = self.formatter(hi)
            elif row == height - 1:
                label = self.formatter(lo)
            else:
                label = ""
            text.append(f"{label:>{self.GUTTER - 1}}▕", style="dim")
            for col in range(width):
                mask = cells[row][col]
                if col in marker_cells:
                    if row == 0:
                        text.append(str(marker_cells[col] % 10), style="bold yellow")
                    elif mask:
                        text.append(chr(_BRAILLE_BASE + mask), style=f"bold {self.color}")
                    else:
                        text.append("┊", style="yellow")
                elif mask and ((row, col) in clipped or col in unsteady):
                    # warm-up, or off the steady scale: drawn, dimmed
                    text.append(chr(_BRAILLE_BASE + mask), style=f"dim {self.color}")
                elif mask:
                    text.append(chr(_BRAILLE_BASE + mask), style=self.color)
                else:
                    text.append(" ")
            if row != height - 1:
                text.append("\n")
        return text

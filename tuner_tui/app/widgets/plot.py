"""A line plot of one series over the session's steps, drawn in braille, with configuration
changes marked. Used for tokens/s, step time and loss."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

_BRAILLE_BASE = 0x2800
# Bit of each dot in a braille cell, indexed [row][column] (rows top to bottom).
_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


def bucket(values: Sequence[float], columns: int) -> list[float]:
    """`values` squeezed (mean of each bucket, NaNs skipped) or left as they are, to at most
    `columns` points."""
    n = len(values)
    if n <= columns:
        return list(values)
    out = []
    for c in range(columns):
        chunk = [v for v in values[c * n // columns : (c + 1) * n // columns] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def value_range(values: Sequence[float], zero_based: bool) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
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
) -> list[list[int]]:
    """Dot masks, `height` rows of `width` cells; each point is one dot column, joined to the
    previous point by a vertical run so the line stays continuous."""
    cells = [[0] * width for _ in range(height)]
    rows = height * 4
    previous: int | None = None
    for x, value in enumerate(values[: width * 2]):
        if not math.isfinite(value):
            previous = None
            continue
        y = round((hi - value) / (hi - lo) * (rows - 1))
        y = min(rows - 1, max(0, y))
        top, bottom = (y, y) if previous is None else (min(y, previous), max(y, previous))
        for dot_row in range(top, bottom + 1):
            cells[dot_row // 4][x // 2] |= _DOT_BITS[dot_row % 4][x % 2]
        previous = y
    return cells


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
        self._markers: list[tuple[int, int]] = []
        self.border_title = title

    def set_data(self, values: Sequence[float], markers: Sequence[tuple[int, int]]) -> None:
        """`markers` are (index into values, run number) pairs."""
        self._values = list(values)
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
        points = bucket(self._values, width * 2)
        n = len(self._values)
        lo, hi = value_range(points, self.zero_based)
        cells = braille_lines(points, width, height, lo, hi)
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
                elif mask:
                    text.append(chr(_BRAILLE_BASE + mask), style=self.color)
                else:
                    text.append(" ")
            if row != height - 1:
                text.append("\n")
        return text

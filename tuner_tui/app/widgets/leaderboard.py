"""Every configuration tried this session, sortable, with its change against the baseline.

The columns fit the panel's width: where it is narrow the least needed columns go first (MFU,
compile, loss, step time, memory), so the rate, the change, the spread and the status stay.
The title says which row leads, only when its lead is larger than the noise (standings.py);
★ marks that row, = the rows tied at the top.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from tuner_tui import format as fmt
from tuner_tui.app.session import Row, Session
from tuner_tui.app.standings import Standing, standing
from tuner_tui.engine.noise import is_noisy, spread
from tuner_tui.engine.protocol import measured_peak

STATUS_STYLE = {"ok": "green", "loss-mismatch": "yellow"}

# (column key, header, sort key). Sort keys put unknown figures last whatever the direction.
# "{item}" in a header is the workload's item name (tokens, images, samples).
COLUMNS: tuple[tuple[str, str, Callable[[Row, Session], Any]], ...] = (
    ("number", "#", lambda r, s: r.number),
    ("label", "configuration", lambda r, s: r.result.label),
    ("tokens", "{item}/s", lambda r, s: r.result.tokens_per_s),
    ("change", "vs base", lambda r, s: s.change_vs_baseline(r)),
    ("step", "step ms", lambda r, s: r.result.step_ms),
    ("spread", "±", lambda r, s: spread(r.result)),
    ("mfu", "MFU", lambda r, s: r.result.mfu),
    ("memory", "peak mem", lambda r, s: measured_peak(r.result)),
    ("compile", "compile s", lambda r, s: r.result.compile_s),
    ("loss", "loss", lambda r, s: r.result.loss_ok),
    ("status", "status", lambda r, s: r.result.status),
)
SORT_KEYS = {key: fn for key, _, fn in COLUMNS}
SORT_CYCLE = ("number", "tokens", "step", "memory", "compile")
DROP_ORDER = ("mfu", "compile", "loss", "step", "memory", "change", "spread")
"""Columns left out, in this order, where the panel is too narrow for all of them."""
LABEL_MIN = 24
"""Narrower, two labels of a session often read the same ("fp32 + sdpa + c…")."""
CELL_PADDING = 2
# Every column gets its width here, from its cells: DataTable widens a column only when it is
# idle, and a busy dashboard showed "numerics" as "numeri".


def _compile_cell(r) -> Text:
    # An eager run's first step is not compile time, unless it built something once (torchao's
    # compiled optimizer step).
    if r.config.get("compile_mode", "off") == "off" and not r.first_step_builds:
        return Text("eager", style="dim", justify="right")
    return Text(fmt.seconds(r.compile_s), justify="right")


def cells(row: Row, session: Session, standings: Standing | None = None) -> dict[str, Any]:
    """The row's cells by column key."""
    r = row.result
    change = session.change_vs_baseline(row)
    change_style = "" if change is None else ("green" if change > 1.005 else "red" if change < 0.995 else "")
    loss = "—" if r.loss_ok is None else ("✓" if r.loss_ok else "✗")
    mark = standings.mark(row) if standings is not None else ""
    return {
        "number": Text(f"{row.number}{mark}", style="bold" if mark == "★" else ""),
        "label": r.label,
        "tokens": Text(fmt.rate(r.tokens_per_s), justify="right"),
        "change": Text(fmt.speedup(change), style=change_style, justify="right"),
        "step": Text(fmt.milliseconds(r.step_ms), justify="right"),
        # Half the interquartile range of the step times; yellow when too wide to rank by.
        "spread": Text(fmt.spread(spread(r)), style="yellow" if is_noisy(r) else "dim", justify="right"),
        "mfu": Text(fmt.fraction(r.mfu), justify="right"),
        "memory": Text(fmt.size(measured_peak(r)), justify="right"),
        "compile": _compile_cell(r),
        "loss": Text(loss, style="green" if r.loss_ok else "red", justify="center"),
        "status": Text(r.status, style=STATUS_STYLE.get(r.status, "bold red")),
    }


def fit_columns(rows: list[dict[str, Any]], headers: dict[str, str],
                width: int) -> tuple[list[str], dict[str, int]]:
    """The columns that fit in `width` cells and the width of each: DROP_ORDER goes first (MFU
    at once where no row has one), while the configuration column would get less than
    LABEL_MIN; it takes what is left, up to its longest label."""
    def natural(key: str) -> int:
        longest = max((len(c[key].plain if isinstance(c[key], Text) else str(c[key])) for c in rows),
                      default=0)
        return max(len(headers[key]), longest, 6 if key == "status" else 1)

    keys = [key for key, _, _ in COLUMNS]
    if rows and all(c["mfu"].plain == fmt.UNKNOWN for c in rows):
        keys.remove("mfu")
    widths = {key: natural(key) for key in keys}

    def needed(ks: list[str]) -> int:
        return sum(min(widths[k], LABEL_MIN) if k == "label" else widths[k] for k in ks) \
            + CELL_PADDING * len(ks)

    for key in DROP_ORDER:
        if needed(keys) <= width:
            break
        if key in keys:
            keys.remove(key)
    others = sum(widths[k] + CELL_PADDING for k in keys if k != "label")
    label = widths["label"]
    widths["label"] = max(min(label, LABEL_MIN), min(label, width - others - CELL_PADDING))
    return keys, {k: widths[k] for k in keys}


def sorted_rows(session: Session, column: str, reverse: bool) -> list[Row]:
    key = SORT_KEYS[column]
    known = [r for r in session.rows if key(r, session) is not None]
    unknown = [r for r in session.rows if key(r, session) is None]
    return sorted(known, key=lambda r: key(r, session), reverse=reverse) + unknown


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


class Leaderboard(DataTable):
    """Rows keyed by run number; `show(session)` redraws and keeps the cursor on its row."""

    DEFAULT_CSS = """
    Leaderboard {
        height: 1fr;
    }
    """

    class Sorted(Message):
        def __init__(self, column: str, reverse: bool) -> None:
            super().__init__()
            self.column = column
            self.reverse = reverse

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_column = "number"
        self.sort_reverse = False
        self._session: Session | None = None
        self._shown: tuple | None = None
        self._layout: tuple | None = None
        self.chosen = False
        """True once the user moved the cursor: `e` then exports that row."""
        self.standings = Standing()
        """The order as far as the noise allows (standings.py), as last shown."""

    def selected_number(self) -> int | None:
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return int(key.value) if key.value is not None else None

    def _width(self) -> int:
        return max(20, self.scrollable_content_region.width or self.size.width or 80)

    def show(self, session: Session, force: bool = False) -> None:
        self._session = session
        signature = (id(session), session.rows_version, session.item_name, self._width())
        if not force and self._shown == signature:
            return
        self._shown = signature
        self.standings = standing(session.rows)
        title = self.standings.text(session.item_name)
        self.border_subtitle = title
        selected = self.selected_number() if self.chosen else None
        ordered = sorted_rows(session, self.sort_column, self.sort_reverse)
        row_cells = [cells(row, session, self.standings) for row in ordered]
        headers = {key: header.format(item=session.item_name) for key, header, _ in COLUMNS}
        keys, widths = fit_columns(row_cells, headers, self._width())
        layout = (tuple(widths.items()), headers["tokens"])
        if layout != self._layout:
            self._layout = layout
            self.clear(columns=True)
            for key in keys:
                self.add_column(headers[key], key=key, width=widths[key])
        else:
            self.clear()
        for row, c in zip(ordered, row_cells):
            c["label"] = _cut(c["label"], widths["label"])
            self.add_row(*(c[key] for key in keys), key=str(row.number))
        if selected is None:
            self.move_cursor(row=0)  # nothing chosen: show the top of the ranking
        else:
            try:
                self.move_cursor(row=self.get_row_index(str(selected)))
            except Exception:
                pass

    def on_resize(self) -> None:
        if self._session is not None:
            self.show(self._session)

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        if reverse is None:
            # Same column again flips the direction; figures start best-first.
            if column == self.sort_column:
                reverse = not self.sort_reverse
            else:
                reverse = column in ("tokens", "change", "mfu")
        self.sort_column, self.sort_reverse = column, reverse
        if self._session is not None:
            self.show(self._session, force=True)
        self.post_message(self.Sorted(column, reverse))

    def cycle_sort(self) -> None:
        order = list(SORT_CYCLE)
        next_column = order[(order.index(self.sort_column) + 1) % len(order)] if self.sort_column in order else order[0]
        self.sort_by(next_column)

    # The cursor also moves when rows are redrawn; only these moves are the user choosing a row.
    def _user_moved(self) -> None:
        self.chosen = True

    def action_cursor_up(self) -> None:
        self._user_moved()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self._user_moved()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self._user_moved()
        super().action_page_up()

    def action_page_down(self) -> None:
        self._user_moved()
        super().action_page_down()

    def action_scroll_top(self) -> None:
        self._user_moved()
        super().action_scroll_top()

    def action_scroll_bottom(self) -> None:
        self._user_moved()
        super().action_scroll_bottom()

    def action_select_cursor(self) -> None:
        self._user_moved()
        super().action_select_cursor()

    def _on_click(self, event) -> None:
        # Textual also runs DataTable's own _on_click (handlers are called along the MRO).
        self._user_moved()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))

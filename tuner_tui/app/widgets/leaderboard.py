"""Every configuration tried this session, sortable, with its change against the baseline."""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from tuner_tui import format as fmt
from tuner_tui.app.session import Row, Session
from tuner_tui.engine.noise import is_noisy, spread

STATUS_STYLE = {"ok": "green", "loss-mismatch": "yellow"}

# (column key, header, sort key). Sort keys put unknown figures last whatever the direction.
COLUMNS: tuple[tuple[str, str, Callable[[Row, Session], Any]], ...] = (
    ("number", "#", lambda r, s: r.number),
    ("label", "configuration", lambda r, s: r.result.label),
    ("tokens", "tokens/s", lambda r, s: r.result.tokens_per_s),
    ("change", "vs base", lambda r, s: s.change_vs_baseline(r)),
    ("step", "step ms", lambda r, s: r.result.step_ms),
    ("spread", "±", lambda r, s: spread(r.result)),
    ("mfu", "MFU", lambda r, s: r.result.mfu),
    ("memory", "peak mem", lambda r, s: r.result.peak_memory_bytes),
    ("compile", "compile s", lambda r, s: r.result.compile_s),
    ("loss", "loss", lambda r, s: r.result.loss_ok),
    ("status", "status", lambda r, s: r.result.status),
)
SORT_KEYS = {key: fn for key, _, fn in COLUMNS}
SORT_CYCLE = ("number", "tokens", "step", "memory", "compile")


def cells(row: Row, session: Session) -> list:
    r = row.result
    change = session.change_vs_baseline(row)
    change_style = "" if change is None else ("green" if change > 1.005 else "red" if change < 0.995 else "")
    loss = "—" if r.loss_ok is None else ("✓" if r.loss_ok else "✗")
    return [
        row.number,
        r.label,
        Text(fmt.rate(r.tokens_per_s), justify="right"),
        Text(fmt.speedup(change), style=change_style, justify="right"),
        Text(fmt.milliseconds(r.step_ms), justify="right"),
        # Half the interquartile range of the step times; yellow when too wide to rank by.
        Text(fmt.spread(spread(r)), style="yellow" if is_noisy(r) else "dim", justify="right"),
        Text(fmt.fraction(r.mfu), justify="right"),
        Text(fmt.size(r.peak_memory_bytes), justify="right"),
        # An eager run's "compile" time is only its first step: not shown as compile time.
        Text(fmt.seconds(r.compile_s), justify="right")
        if r.config.get("compile_mode", "off") != "off"
        else Text("eager", style="dim", justify="right"),
        Text(loss, style="green" if r.loss_ok else "red", justify="center"),
        Text(r.status, style=STATUS_STYLE.get(r.status, "bold red")),
    ]


def sorted_rows(session: Session, column: str, reverse: bool) -> list[Row]:
    key = SORT_KEYS[column]
    known = [r for r in session.rows if key(r, session) is not None]
    unknown = [r for r in session.rows if key(r, session) is None]
    return sorted(known, key=lambda r: key(r, session), reverse=reverse) + unknown


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
        self.chosen = False
        """True once the user moved the cursor: `e` then exports that row."""

    def on_mount(self) -> None:
        for key, header, _ in COLUMNS:
            # The status column is as wide as its longest word from the start: DataTable widens
            # a column only when it is idle, and a busy dashboard showed "numerics" as "numeri".
            width = len("loss-mismatch") if key == "status" else None
            self.add_column(header, key=key, width=width)

    def selected_number(self) -> int | None:
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return int(key.value) if key.value is not None else None

    def show(self, session: Session, force: bool = False) -> None:
        self._session = session
        signature = self._signature(session)
        if not force and self._shown == signature:
            return
        self._shown = signature
        selected = self.selected_number() if self.chosen else None
        self.clear()
        for row in sorted_rows(session, self.sort_column, self.sort_reverse):
            self.add_row(*cells(row, session), key=str(row.number))
        if selected is None:
            self.move_cursor(row=0)  # nothing chosen: show the top of the ranking
        else:
            try:
                self.move_cursor(row=self.get_row_index(str(selected)))
            except Exception:
                pass

    @staticmethod
    def _signature(session: Session) -> tuple:
        return (id(session), session.rows_version)

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

"""`GputuneApp`: the dashboard. It speaks to the worker only through protocol messages.

The app composes the widgets and forwards events and keys: `Session` records what the worker
did, `Controller` decides what it runs next (the apply queue, crash fallback, the search), and
the app shows both.

The event source is injected (`source_factory`): the real dashboard passes a factory of
`WorkerClient`s, tests pass fakes that replay recorded events. Telemetry is sampled in a thread of
this process, so the GPU and host panels keep moving while the worker compiles or is restarted.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header
from textual.worker import get_current_worker

from strategies.applicability import inapplicable_options, training_changing_options
from strategies.config import ConfigError, ExportedConfig, TuneConfig
from tuner_tui import format as fmt
from tuner_tui.app import layout
from tuner_tui.app.controller import Controller
from tuner_tui.app.palette import palette_commands
from tuner_tui.app.reader import EventReader, EventSource, EventsReady, WorkerExited, WorkerStarted
from tuner_tui.app.screens.export import ExportRequest, ExportScreen
from tuner_tui.app.screens.help import HelpScreen
from tuner_tui.app.screens.history import HistoryScreen, load_history
from tuner_tui.app.screens.log import LogScreen
from tuner_tui.app.session import Row, Session
from tuner_tui.app.store_writer import StoreWriter
from tuner_tui.app.widgets.config_view import ConfigView
from tuner_tui.app.widgets.figures import CurrentFigures
from tuner_tui.app.widgets.gpu_panel import GpuPanel
from tuner_tui.app.widgets.host_panel import HostPanel
from tuner_tui.app.widgets.memory_panel import MemoryPanel
from tuner_tui.app.widgets.leaderboard import Leaderboard
from tuner_tui.app.widgets.plot import TimeSeriesPlot
from tuner_tui.app.profiling import profile_arrived, request_profile, show_profile
from tuner_tui.app.widgets.profile_panel import ProfilePanel
from tuner_tui.app.widgets.run_status import RunStatus
from tuner_tui.app.widgets.toggles import TogglesPanel
from tuner_tui.engine import protocol

REFRESH_S = 0.25
"""Live panels redraw four times a second (step events in between collapse into one redraw)."""
TELEMETRY_S = 0.5


class TelemetrySampled(Message):
    def __init__(self, sample: Any) -> None:
        super().__init__()
        self.sample = sample


def _default_sampler():
    from tuner_tui.engine.telemetry import TelemetrySampler

    return TelemetrySampler()


class GputuneApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "gputune"

    # The footer holds what fits in 80 columns; the others are in the help (?) and the palette.
    BINDINGS = [
        Binding("a", "apply", "Apply"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("r", "reapply", "Re-apply", show=False),
        Binding("e", "export", "Export"),
        Binding("s", "sort", "Sort", show=False),
        Binding("t", "search", "Search"),
        Binding("h", "history", "History", show=False),
        Binding("x", "profile", "Profile"),
        Binding("X", "profile(True)", "Profile + trace", show=False),
        Binding("v", "next_view", "View"),
        Binding("l", "log", "Log"),
        Binding("b", "baseline", "Baseline", show=False),
        Binding("ctrl+r", "restart_worker", "Restart worker", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    layout_mode: reactive[str] = reactive(layout.FULL, init=False)
    """full, medium or compact (layout.py): a class on the app that app.tcss lays out by."""
    view: reactive[str] = reactive("plots", init=False)
    """The compact layout's view beside the figures (layout.VIEWS)."""
    profile_shown: reactive[bool] = reactive(False, init=False)
    """The profile in the plots' place (in the compact layout: the profile view)."""

    def __init__(
        self,
        source_factory: Callable[[], EventSource],
        start_config: TuneConfig | None = None,
        sampler_factory: Callable[[], Any] | None = _default_sampler,
        *,
        auto_restart: bool = True,
        subtitle: str = "",
        clock: Callable[[], float] = time.monotonic,
        telemetry_interval: float = TELEMETRY_S,
        measure_steps: int = 20,
        memory_budget: int | None = None,
        log_path: str | None = None,
        record: bool = False,
    ) -> None:
        """`log_path`: the worker's log file, named in the log view. `record`: keep the rows in
        the result store, for `h` here and for bench and tune (the real dashboard does; tests
        leave the user's store alone)."""
        super().__init__()
        self.source_factory = source_factory
        self.start_config = start_config
        self.sampler_factory = sampler_factory
        self.auto_restart = auto_restart
        self.clock = clock
        self.telemetry_interval = telemetry_interval
        self.memory_budget = memory_budget
        """The memory budget the memory panel measures the peak against (--max-memory)."""
        self.sub_title = subtitle
        self.session = Session(clock=clock, log_path=log_path or "")
        self.record = record
        self._store: StoreWriter | None = None
        self._recorded: dict[int, int] = {}
        self._view_before_profile = "plots"
        self.controller = Controller(self.session, self, start_config, measure_steps=measure_steps)
        """Decides what the worker runs next; this class composes widgets and forwards to it."""
        self.reader: EventReader | None = None
        self._plots_version = -1
        self._telemetry_stop = threading.Event()
        self._quitting = False

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="⚡")
        yield RunStatus(id="status")
        with Horizontal(id="main"):
            yield TogglesPanel(self.start_config or TuneConfig(), id="toggles")
            with Vertical(id="plots"):
                yield TimeSeriesPlot("tokens/s", fmt.rate, id="plot-throughput", color="green")
                yield TimeSeriesPlot("step ms", fmt.milliseconds, id="plot-step", color="cyan")
                yield TimeSeriesPlot("loss", fmt.loss, id="plot-loss", color="magenta", zero_based=False)
            yield ProfilePanel(id="profile")
            with Vertical(id="right"):
                yield CurrentFigures(id="figures")
                with VerticalScroll(id="system"):
                    yield MemoryPanel(id="memory")
                    yield GpuPanel(id="gpu")
                    yield HostPanel(id="host")
        with Horizontal(id="bottom"):
            yield Leaderboard(id="leaderboard")
            yield ConfigView(id="config-view")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        # Held directly: timers and thread messages may arrive while another screen is on top.
        self.toggles = self.query_one(TogglesPanel)
        self.leaderboard = self.query_one(Leaderboard)
        self.config_view = self.query_one(ConfigView)
        self.status_line = self.query_one(RunStatus)
        self.figures = self.query_one(CurrentFigures)
        self.memory_panel = self.query_one(MemoryPanel)
        self.gpu_panel = self.query_one(GpuPanel)
        self.host_panel = self.query_one(HostPanel)
        self.profile_panel = self.query_one(ProfilePanel)
        self.profile_panel.border_title = "where the step goes"
        self.plots = {
            "throughput": self.query_one("#plot-throughput", TimeSeriesPlot),
            "step": self.query_one("#plot-step", TimeSeriesPlot),
            "loss": self.query_one("#plot-loss", TimeSeriesPlot),
        }
        self.query_one("#toggles").border_title = "options"
        self.query_one("#figures").border_title = "current run"
        self.query_one("#memory").border_title = "memory"
        self.query_one("#gpu").border_title = "GPU"
        self.query_one("#host").border_title = "host"
        self.query_one("#leaderboard").border_title = "leaderboard"
        self.query_one("#config-view").border_title = "configuration"
        self.config_view.show(None)
        self.query_one("#system").can_focus = False
        self._set_layout(self.size.width, self.size.height)
        self.watch_layout_mode(self.layout_mode)  # (a reactive's first value calls no watcher)
        self.set_class(True, f"-view-{self.view}")
        if self.record:
            self._store = StoreWriter(
                lambda problem: self.session.log("warning", problem, "store"))
        self.reader = EventReader(self.source_factory, self.post_message, self.auto_restart)
        self.reader.start()
        self.set_interval(REFRESH_S, self.refresh_live)
        if self.sampler_factory is not None:
            self.sample_telemetry()
        else:
            self.gpu_panel.update("telemetry off")
        self.refresh_live()

    def on_unmount(self) -> None:
        self._telemetry_stop.set()
        if self.reader is not None:
            self.reader.close()
        if self._store is not None:
            self._store.close()

    # -- layout by size (layout.py, app.tcss) ----------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        self._set_layout(event.size.width, event.size.height)

    def _set_layout(self, width: int, height: int) -> None:
        self.layout_mode = layout.layout_for(width, height)

    def watch_layout_mode(self, mode: str) -> None:
        for name in layout.LAYOUTS:
            self.set_class(name == mode, f"-{name}")
        self.refresh_bindings()
        self._title_views()

    def watch_view(self, old: str, new: str) -> None:
        self.set_class(False, f"-view-{old}")
        self.set_class(True, f"-view-{new}")
        self._title_views()

    def watch_profile_shown(self, shown: bool) -> None:
        self.set_class(shown, "-profiling")
        if shown and self.view != "profile":
            self._view_before_profile = self.view
            self.view = "profile"
        elif not shown and self.view == "profile":
            self.view = self._view_before_profile

    def _title_views(self) -> None:
        """In the compact layout the figures' panel names the view beside it and the key."""
        if not self.is_mounted:
            return
        figures = self.query_one("#figures")
        figures.border_subtitle = (f"v: {layout.VIEW_TITLES[layout.next_view(self.view, self._has_profile())]} →"
                                   if self.layout_mode == layout.COMPACT else "")

    def _has_profile(self) -> bool:
        return bool(self.session.profiled or self.session.profile_note or self.profile_shown)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "next_view" and self.layout_mode != layout.COMPACT:
            return False  # nothing to switch: every panel is on screen
        return True

    def action_next_view(self) -> None:
        """The next view beside the figures (compact layout)."""
        new = layout.next_view(self.view, self._has_profile())
        if new == "profile" or self.view == "profile":
            self.profile_shown = new == "profile"
        self.view = new

    # -- telemetry thread ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="telemetry", exit_on_error=False, name="telemetry")
    def sample_telemetry(self) -> None:
        worker = get_current_worker()
        sampler = self.sampler_factory()
        try:
            while not worker.is_cancelled and not self._telemetry_stop.is_set():
                pid = self.reader.pid if self.reader is not None else None
                self.post_message(TelemetrySampled(sampler.sample(pid)))
                self._telemetry_stop.wait(self.telemetry_interval)
        finally:
            sampler.close()

    def on_telemetry_sampled(self, message: TelemetrySampled) -> None:
        self.gpu_panel.sample = message.sample
        self.host_panel.sample = message.sample

    # -- worker events ---------------------------------------------------------------------------
    def on_events_ready(self, message: EventsReady) -> None:
        if self.reader is None:
            return
        events = self.reader.take()
        now = self.clock()
        rows_before = len(self.session.rows)
        if not self.is_running:
            # Shutting down: the widgets are being removed and nothing more is asked of the
            # worker; the session (and the store) still take what it sent last.
            for event in events:
                if not isinstance(event, (WorkerStarted, WorkerExited)):
                    self.session.apply(event, now)
            self._record_rows()
            return
        for event in events:
            if isinstance(event, WorkerStarted):
                self._worker_started(event)
            elif isinstance(event, WorkerExited):
                self._worker_exited(event)
            else:
                self.session.apply(event, now)
                self._react(event)
        self.leaderboard.show(self.session)
        if len(self.session.rows) != rows_before or not self._row_chosen:
            self.show_selected_row()
        self._record_rows()

    def _record_rows(self) -> None:
        """New and changed rows into the result store (`h` lists them)."""
        if self._store is None:
            return
        source = "dashboard search" if self.controller.search is not None else "dashboard"
        for row in self.session.rows:
            if self._recorded.get(row.number) != id(row.result) and row.result.status != "crash":
                self._recorded[row.number] = id(row.result)
                self._store.record(row.result, self.session.environment, self.session.workload,
                                   self.controller.measure_steps, self.session.warmup_steps,
                                   source)

    def _react(self, event: Any) -> None:
        """What the screen shows about an event beyond the session; then the controller acts."""
        if isinstance(event, protocol.WorkerReady):
            caps = self.session.capabilities
            self.toggles.capabilities = caps
            self.toggles.inapplicable = inapplicable_options(self.session.workload)
            self.toggles.changes_training = training_changing_options(self.session.workload)
            self.sub_title = f"{self.session.workload.get('name', '')} · {caps.gpu_name or caps.device}"
        elif isinstance(event, protocol.RunStarted):
            try:
                self.toggles.mark_applied(event.config)
            except ConfigError:
                pass
        elif isinstance(event, protocol.ProfileMeasured):
            profile_arrived(self, event)
        self.controller.on_event(event)

    # -- what the controller asks of the screen (`Controls`) ---------------------------------------
    def send(self, command: Any) -> bool:
        return self.reader is not None and self.reader.send(command)

    def show_config(self, config: TuneConfig) -> None:
        self.toggles.set_config(config, applied=False)

    def show_search_result(self) -> None:
        self.leaderboard.sort_by("tokens", reverse=True)

    # -- the controller's state, for scripts and tests ------------------------------------------
    @property
    def search(self):
        """The automatic search in progress, if any (key t)."""
        return self.controller.search

    @property
    def last_requested(self) -> TuneConfig | None:
        """The configuration last sent to the worker (re-applied after a restart)."""
        return self.controller.last_requested

    @last_requested.setter
    def last_requested(self, config: TuneConfig | None) -> None:
        self.controller.last_requested = config

    def apply_in_turn(self, configs: Iterable[TuneConfig]) -> None:
        """Apply `configs` one after another, each once the previous one is measured."""
        self.controller.apply_in_turn(configs)

    def _worker_started(self, message: WorkerStarted) -> None:
        self.session.worker_started(message.pid)

    def _worker_exited(self, message: WorkerExited) -> None:
        if self._quitting:
            return
        self.controller.worker_exited(message.exitcode, message.pid, message.reason, message.restarting)
        self.leaderboard.show(self.session)

    # -- live refresh ----------------------------------------------------------------------------
    def refresh_live(self) -> None:
        now = self.clock()
        session = self.session
        self.status_line.show(session, now)
        self.figures.show(session, now)
        self.memory_panel.show(session.current_result(), self.memory_budget)
        if session.version == self._plots_version:
            return
        self._plots_version = session.version
        self.plots["throughput"].title = f"{session.item_name}/s"
        dropped = session.throughput.dropped
        markers = [(m.position - dropped, m.number) for m in session.markers if m.position >= dropped]
        steady = session.throughput.steady
        self.plots["throughput"].set_data(session.throughput.values, markers, steady)
        self.plots["step"].set_data(session.step_ms.values, markers, steady)
        self.plots["loss"].set_data(session.loss.values, markers, steady)

    # -- leaderboard selection -------------------------------------------------------------------
    def _selected_row(self) -> Row | None:
        number = self.leaderboard.selected_number()
        return next((r for r in self.session.rows if r.number == number), None)

    def chosen_row(self) -> Row | None:
        """The leaderboard row the user picked, None until they pick one."""
        return self._selected_row() if self._row_chosen else None

    def show_selected_row(self) -> None:
        """The chosen row, or until the user picks one, the current run's (or the last) row."""
        if self._row_chosen:
            row = self._selected_row()
        else:
            row = self.session.row_for_run(self.session.run_id) or (self.session.rows[-1] if self.session.rows else None)
        self.config_view.show(row)
        show_profile(self, row)

    @on(DataTable.RowHighlighted, "#leaderboard")
    @on(DataTable.RowSelected, "#leaderboard")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_selected_row()

    @property
    def _row_chosen(self) -> bool:
        return self.leaderboard.chosen

    @on(Leaderboard.Sorted)
    def _sorted(self, event: Leaderboard.Sorted) -> None:
        direction = "descending" if event.reverse else "ascending"
        self.notify(f"leaderboard sorted by {event.column}, {direction}", timeout=2)

    # -- applying --------------------------------------------------------------------------------
    @on(TogglesPanel.ApplyRequested)
    def _apply_requested(self, event: TogglesPanel.ApplyRequested) -> None:
        if event.config is None:
            self.notify(event.problem, title="cannot apply", severity="error", timeout=8)
            return
        if self.controller.apply_instead(event.config, "options applied by hand", show=False):
            self.notify(f"applying {event.config.label()}", timeout=3)

    def action_apply(self) -> None:
        self.toggles.request_apply()

    def action_reapply(self) -> None:
        self.controller.reapply_row(self._selected_row())

    def action_baseline(self) -> None:
        self.controller.apply_instead(self.controller.baseline_config, "baseline applied")

    def action_search(self) -> None:
        """Start the automatic search, or stop it."""
        self.controller.toggle_search()

    def action_toggle_pause(self) -> None:
        paused = self.session.worker_state == "paused"
        command = protocol.Resume() if paused else protocol.Pause()
        if self.reader is None or not self.reader.send(command):
            self.notify("No worker to pause.", severity="warning")

    def action_sort(self) -> None:
        self.leaderboard.cycle_sort()

    @work(thread=True, group="restart", exclusive=True, exit_on_error=False)
    def action_restart_worker(self) -> None:
        if self.reader is not None:
            self.reader.restart_worker()

    # -- export ----------------------------------------------------------------------------------
    def export_target(self) -> tuple[str, ExportedConfig]:
        """What `e` exports now (see Controller.export_target)."""
        row = self.chosen_row()
        return self.controller.export_target(row, self.toggles.applied)

    def action_export(self) -> None:
        """Export the chosen leaderboard row, else the best (of a tie, the simpler), else the
        current configuration; the dialog says which."""
        try:
            what, exported = self.export_target()
        except ConfigError as exc:
            self.notify(str(exc), title="cannot export", severity="error")
            return

        def write(request: ExportRequest | None) -> None:
            if request is not None:
                self.controller.write_export(exported, request.path, request.fmt)

        self.push_screen(ExportScreen(what), write)

    # -- profile ---------------------------------------------------------------------------------
    def action_profile(self, trace: bool = False) -> None:
        """Profile the selected row or the current run (key x; X also writes a trace)."""
        request_profile(self, trace)

    # -- history ---------------------------------------------------------------------------------
    def action_history(self) -> None:
        if self.session.capabilities is None:
            self.notify("The worker is not ready yet: the history is per machine.", severity="warning")
            return
        self._load_history(dict(self.session.environment), dict(self.session.workload))

    @work(thread=True, exclusive=True, group="history", exit_on_error=False)
    def _load_history(self, environment: dict, description: dict) -> None:
        """Reads the result store in a thread (SQLite may wait on a writer's lock)."""
        caps = self.session.capabilities
        trials, workload, problem = load_history(environment, description)
        where = f"{caps.gpu_name or caps.device}, {workload}"
        self.call_from_thread(self._show_history, trials, where, problem)

    def _show_history(self, trials: list, where: str, problem: str) -> None:
        if not isinstance(self.screen, HistoryScreen):
            self.push_screen(HistoryScreen(trials, where, problem, self.session.item_name),
                             self.controller.reapply_past)

    # -- log -------------------------------------------------------------------------------------
    def action_log(self) -> None:
        if not isinstance(self.screen, LogScreen):
            self.push_screen(LogScreen(self.session))

    # -- help, palette, quit ---------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from palette_commands(self)

    async def action_quit(self) -> None:
        if self._quitting:
            return
        self._quitting = True
        self.session.worker_state = "stopped"
        self.notify("stopping the worker…", timeout=2)
        self._stop_and_exit()

    @work(thread=True, group="shutdown", exit_on_error=False)
    def _stop_and_exit(self) -> None:
        self._telemetry_stop.set()
        if self.reader is not None:
            self.reader.close()
        self.call_from_thread(self.exit, 0)

"""What the dashboard does about events and keys, as a plain object beside `Session`.

`Session` records what happened; `Controller` decides what to send next: the baseline then the
start configuration, configurations queued one after another, one asked for before the worker
was ready, the last one again after a crash (or the baseline once a configuration has killed
the worker twice), the automatic search trial by trial, and the export and history choices.
It reaches the screen only through `Controls` (the app, or a recording stand-in in tests), so
this state machine is tested without Textual.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

from strategies import exports
from strategies.config import ConfigError, ExportedConfig, TuneConfig
from tuner_tui import format as fmt
from tuner_tui.app.search import LiveSearch
from tuner_tui.app.session import Row, Session
from tuner_tui.app.standings import Standing, standing
from tuner_tui.engine import protocol
from tuner_tui.engine.noise import noise_warning, spread, tie_gap

CRASHES_BEFORE_BASELINE = 2
"""A configuration that killed the worker this many times is not re-applied after a restart."""


class Controls(Protocol):
    """What the controller asks of the screen."""

    def send(self, command: Any) -> bool:
        """Send a command to the worker; False when there is no worker to send it to."""

    def notify(self, message: str, *, title: str = "", severity: str = "information", timeout: float | None = None) -> None:
        ...

    def show_config(self, config: TuneConfig) -> None:
        """Show `config` in the options panel as not applied yet."""

    def show_search_result(self) -> None:
        """The search is over: rank the leaderboard by throughput."""


class Controller:
    def __init__(
        self,
        session: Session,
        controls: Controls,
        start_config: TuneConfig | None = None,
        *,
        measure_steps: int = 20,
        search_factory: Callable[..., LiveSearch] = LiveSearch,
    ) -> None:
        self.session = session
        self.controls = controls
        self.start_config = start_config
        self.measure_steps = measure_steps
        session.measure_steps = measure_steps
        """Steps measured after warm-up before a run gets its leaderboard row."""
        self.search_factory = search_factory
        self.baseline_config = TuneConfig()
        self.last_requested: TuneConfig | None = None
        """The configuration last sent to the worker (re-applied after a restart)."""
        self.deferred: TuneConfig | None = None
        """Asked for before the worker was ready; sent on WorkerReady."""
        self.queue: list[TuneConfig] = []
        """Configurations to apply once the current trial is over (the start config after the
        baseline)."""
        self.crashes: dict[TuneConfig, int] = {}
        """How many times each configuration was in flight when the worker died."""
        self.search: LiveSearch | None = None
        """The automatic search in progress, if any (key t)."""
        self._ready_once = False

    # -- applying --------------------------------------------------------------------------------
    def apply(self, config: TuneConfig) -> bool:
        """Send `config` to the worker (or keep it until the worker is ready). False when this
        machine cannot run it (the user is told why)."""
        caps = self.session.capabilities
        if caps is not None:
            try:
                config.check_runnable(caps)
            except ConfigError as exc:
                self.controls.notify(str(exc), title="cannot apply", severity="error", timeout=8)
                return False
        self.last_requested = config
        sent = caps is not None and self.controls.send(
            protocol.ApplyConfig(config, measure_steps=self.measure_steps)
        )
        if sent:
            self.session.applying(config.to_dict(), config.label())
        else:
            self.deferred = config
            self.controls.notify(f"{config.label()} will be applied when the worker is ready", timeout=3)
        return True

    def apply_in_turn(self, configs: Iterable[TuneConfig]) -> None:
        """Apply `configs` one after another, each once the previous one is measured (or
        failed); the start configuration and scripted sessions use this."""
        self.queue.extend(configs)
        measured = self.session.current_result() is not None
        if self.queue and (measured or self.session.worker_state == "idle"):
            self._next_in_queue()

    def apply_instead(self, config: TuneConfig, why: str, *, show: bool = True) -> bool:
        """The user chose `config` (options panel, a row, the baseline, the history): it
        replaces the search and the queue. `why` ends the line that stops a search."""
        if show:
            self.controls.show_config(config)
        self.stop_search(f"stopped: {why}")
        self.queue.clear()
        return self.apply(config)

    def _next_in_queue(self) -> None:
        if self.queue:
            self.apply(self.queue.pop(0))

    # -- worker events ---------------------------------------------------------------------------
    def on_event(self, event: Any) -> None:
        """What to do about a worker event, once the session has recorded it."""
        if isinstance(event, protocol.WorkerReady):
            self._worker_ready()
        elif isinstance(event, protocol.TrialFinished):
            # The row says it; no notice over the panels.
            result = event.result
            self.session.log("info", f"measured {result.label}: {fmt.rate(result.tokens_per_s)} "
                             f"{self.session.item_name}/s, {fmt.milliseconds(result.step_ms)} ms/step "
                             f"{fmt.spread(spread(result))} over {result.measured_steps} steps")
            self._after_trial()
        elif isinstance(event, protocol.RunFailed):
            self.controls.notify(event.message or event.kind, title=f"run failed: {event.kind}", severity="error", timeout=10)
            self._after_trial()
        elif (isinstance(event, protocol.WorkerLog) and event.level in ("warning", "error")
              and not event.source):
            # The worker's own word (a reference that does not fit, a failed profile); the
            # libraries' warnings go to the log view only (key l).
            self.controls.notify(event.text, severity="warning" if event.level == "warning" else "error")

    def _worker_ready(self) -> None:
        if not self._ready_once:
            self._ready_once = True
            first = [self.baseline_config]
            if self.start_config is not None and self.start_config != self.baseline_config:
                first.append(self.start_config)
            self.queue = first[1:]
            self.apply(first[0])
            return
        if self.deferred is not None:
            config, self.deferred = self.deferred, None
            self.apply(config)
            return
        if self.search is not None:
            # The candidate that killed the worker has its crash row: the search moves on.
            self._search_step()
            return
        config = self.last_requested or self.baseline_config
        if self.crashes.get(config, 0) >= CRASHES_BEFORE_BASELINE:
            self.controls.notify(
                f"{config.label()} killed the worker {self.crashes[config]} times; "
                "applying the baseline instead",
                severity="warning",
            )
            config = self.baseline_config
        self.apply(config)

    def _after_trial(self) -> None:
        if self.search is not None:
            self._search_step()
        else:
            self._next_in_queue()

    def worker_exited(self, exitcode: int | None, pid: int | None, reason: str, restarting: bool) -> None:
        """The worker process is gone: a restart the user asked for, or a crash (the
        configuration in flight is counted against it)."""
        if reason == "restart requested":
            self.controls.notify("worker restarted; the last configuration will be re-applied")
            self.session.worker_died(exitcode, crashed=False)
            return
        text = self.session.worker_died(exitcode)
        if pid is None and reason and not self.session.setup_error:
            text = reason
            self.session.worker_note = text
        if self.last_requested is not None:
            self.crashes[self.last_requested] = self.crashes.get(self.last_requested, 0) + 1
        tail = "; starting a new worker" if restarting else (f"; {reason}" if reason else "")
        self.controls.notify(text + tail, title="worker died", severity="error", timeout=10)

    # -- automatic search ------------------------------------------------------------------------
    def toggle_search(self) -> None:
        """Start the search (the engine's anytime search, trial by trial on this worker), or stop
        it. Rows measured so far count as trials already done."""
        if self.search is not None:
            self.stop_search("stopped")
            return
        caps = self.session.capabilities
        if caps is None:
            self.controls.notify("The worker is not ready yet.", severity="warning")
            return
        default_batch = int(self.session.workload.get("default_batch_size") or self.session.batch_size or 1)
        try:
            self.search = self.search_factory(caps, default_batch, workload=self.session.workload)
        except (ConfigError, ImportError) as exc:
            self.controls.notify(str(exc), title="cannot search", severity="error")
            return
        self.queue.clear()
        self.controls.notify(
            f"search started: {self.search.space.describe()} (t stops it)", title="search", timeout=8
        )
        if self.session.current_result() is not None or self.session.worker_state in ("idle", "ready"):
            self._search_step()

    def _search_step(self) -> None:
        search = self.search
        assert search is not None
        while True:
            config = search.propose([r.result for r in self.session.rows])
            if config is None:
                self._finish_search()
                return
            total = "?" if search.planned is None else f"~{search.planned}"
            self.session.search_note = f"search {len(search.tried)}/{total}: {search.current}"
            self.controls.show_config(config)
            if self.apply(config):
                return

    def _finish_search(self) -> None:
        search, self.search = self.search, None
        self.session.search_note = ""
        standings = standing(self.session.rows)
        pick = standings.pick
        if search is None or search.best is None or pick is None:
            self.controls.notify("search over: no configuration ran", title="search", severity="warning")
            return
        config = pick.result.tune_config
        self.controls.notify(f"{self.verdict(standings)}; applied. e exports it.",
                             title="search over", timeout=15)
        self.controls.show_search_result()
        self.controls.show_config(config)
        if TuneConfig.from_dict(self.session.run_config or {}) != config:
            self.apply(config)

    def verdict(self, standings: Standing) -> str:
        """The standing in words: a best only when its lead is larger than the noise; a tie
        (won by the simpler configuration) otherwise."""
        item = self.session.item_name
        pick = standings.pick
        if pick is None:
            return "nothing measured yet"
        rate = f"{fmt.rate(pick.result.tokens_per_s)} {item}/s"
        change = self.session.change_vs_baseline(pick)
        factor = f" ({fmt.speedup(change)} baseline)" if change is not None else ""
        if standings.is_tie():
            rest = [f"#{r.number}" for r in standings.tied if r is not pick]
            others = ", ".join(rest[:3]) + (f" and {len(rest) - 3} more" if len(rest) > 3 else "")
            baseline = self.session.baseline
            within_base = baseline in standings.tied and baseline is not None
            head = ("no configuration is faster than the baseline beyond the spread: "
                    if within_base and pick is baseline else "")
            return (f"{head}tie: #{pick.number} {pick.result.label} {rate}{factor} and {others} "
                    "lie within their spread; the simpler is kept")
        if standings.best is None:
            return f"#{pick.number} {pick.result.label} {rate}{factor}, the only row measured"
        other = standings.runner_up
        gap = tie_gap(spread(pick.result) or 0.0, spread(other.result) or 0.0)
        return (f"best: #{pick.number} {pick.result.label} {rate}{factor}, {standings.lead:.0%} "
                f"ahead of #{other.number}, beyond the ±{gap:.1%} spread")

    def stop_search(self, why: str) -> None:
        if self.search is None:
            return
        self.search = None
        self.session.search_note = ""
        standings = standing(self.session.rows)
        if standings.best is not None:
            tail = f"; best so far: {standings.best.result.label}"
        elif standings.is_tie():
            tail = "; no best so far: " + ", ".join(f"#{r.number}" for r in standings.tied) + \
                " tie within their spread"
        else:
            tail = ""
        self.controls.notify(f"search {why}{tail}", title="search")

    # -- export and history ----------------------------------------------------------------------
    def export_target(self, row: Row | None, shown: TuneConfig) -> tuple[str, ExportedConfig]:
        """What `e` exports: `row` (the chosen leaderboard row), else the best row (of a tie,
        the simpler: standings.py) that ran and passed the loss and gradient checks, else the
        current configuration (or the last requested, else `shown`, the options panel's
        applied one). The description says which and why; the file's [measured] table keeps
        the verdict, and "noisy" where the row was. Raises ConfigError when the row's
        configuration does not parse."""
        environment = dict(self.session.environment)
        workload = str(self.session.workload.get("name", ""))
        standings = standing(self.session.rows)
        why = "the selected row"
        if row is None and standings.pick is not None:
            row = standings.pick
            why = self.verdict(standings)
        if row is not None:
            config = row.result.tune_config
            measured = row.result.measured()
            if row is standings.pick:
                measured["verdict"] = self.verdict(standings)
            if noise_warning(row.result):
                measured["noise"] = noise_warning(row.result)
            what = f"run {row.number}: {row.result.label} ({row.result.status}): {why}"
            return what, ExportedConfig(config, measured, environment, workload)
        if self.session.run_config:
            config = TuneConfig.from_dict(self.session.run_config)
        else:
            config = self.last_requested or shown
        result = self.session.current_result()
        measured = result.measured() if result is not None else {}
        return (f"current configuration: {config.label()} (no row has passed its checks yet)",
                ExportedConfig(config, measured, environment, workload))

    def write_export(self, exported: ExportedConfig, path: str, fmt_name: str | None) -> None:
        try:
            written = exports.write(exported, path, fmt_name)
        except ConfigError as exc:
            self.controls.notify(str(exc), title="export failed", severity="error", timeout=10)
            return
        where = written.path.resolve()
        said = [f"{exported.config.label()} → {where}", *written.lines()]
        self.controls.notify("\n".join(said), title="exported", timeout=8)
        self.session.log("info", f"exported {exported.config.label()} to {where}"
                         + "".join(f"; {n}" for n in written.lines()))

    def reapply_row(self, row: Row | None) -> None:
        if row is None:
            self.controls.notify("The leaderboard is empty: nothing to re-apply.", severity="warning")
            return
        try:
            config = row.result.tune_config
        except ConfigError as exc:
            self.controls.notify(str(exc), title="cannot re-apply", severity="error")
            return
        if self.apply_instead(config, "a row was re-applied"):
            self.controls.notify(f"re-applying run {row.number}: {config.label()}", timeout=3)

    def reapply_past(self, config: dict | None) -> None:
        """A configuration chosen in the history screen (None: closed without a choice)."""
        if config is None:
            return
        try:
            tuned = TuneConfig.from_dict(config)
        except ConfigError as exc:
            self.controls.notify(str(exc), title="cannot re-apply", severity="error")
            return
        if self.apply_instead(tuned, "a past configuration was applied"):
            self.controls.notify(f"re-applying {tuned.label()} from the history", timeout=3)

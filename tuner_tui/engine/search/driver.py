"""`gputune tune`: search the configurations for the fastest one that keeps the numerics, within
a memory budget and a time budget, holding a good answer at every moment.

The search runs in the parent process, which imports no torch; every trial runs in a fresh worker
(`executor.py`). The strategy (`anytime.py`) proposes the baseline, the expert's recipe, then
always the candidate with the highest expected gain per second. Around it, this module:

- reuses a trial measured before on this machine with this code (the result store);
- gives each trial the fp32 reference's losses, run once per workload, batch and machine and
  kept on disk (`reference_cache.py`), and its worker the reference's gradient sketch;
- stops a trial early once it is clearly slower than the best so far, and runs once more one
  measured far below its prediction (`surprise.py`);
- keeps back the time the leaders' interleaved re-measurement will need (`leaders.py`), runs
  it when the search's next trial would eat into that time, and gives what is left after it
  back to the search: the time budget ends with at most one trial's worth unused;
- turns anything that goes wrong with one candidate (a refused combination, an estimate that
  cannot be made, a crash, a hang past its timeout, an error of the search itself) into a row
  with its reason, and every exit (the time budget, Ctrl-C, an internal error) into an
  outcome that the report, the JSON and the export are written from (`outcome.py`);
- keeps a time line: when each trial started and ended, why it was tried, and the best so far.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
from dataclasses import replace
from typing import Callable, TextIO

from strategies.applicability import inapplicable_options, training_changing_options
from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui import format as fmt
from tuner_tui.engine import kernel_knobs
from tuner_tui.engine.paths import compile_cache_environ
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import LOSS_CHECK_STEPS, computes_reference
from tuner_tui.engine.reference_cache import ReferenceCache
from tuner_tui.engine.runner import TrialPlan, trace_path
from tuner_tui.engine.search.anytime import AnytimeSearch
from tuner_tui.engine.search.deadline import Deadline
from tuner_tui.engine.search.proposal import Proposal
from tuner_tui.engine.search.executor import TrialExecutor, WorkerExecutor, error_row
from tuner_tui.engine.search.fit import reference_may_fit
from tuner_tui.engine.search.history import History
from tuner_tui.engine.search.leaders import LeaderRemeasure
from tuner_tui.engine.search.memory import (
    estimate_or_none, measured_peak, parameter_count, prior_estimate,
)
from tuner_tui.engine.search.outcome import assemble
from tuner_tui.engine.search.plan import Event, SearchPlan
from tuner_tui.engine.search.priors import LARGE_MODEL, Context, Priors, store_pairs
from tuner_tui.engine.search.references import References, lost_with
from tuner_tui.engine.search.report import SearchOutcome, budget_scope, startup_line
from tuner_tui.engine.search.space import default_space
from tuner_tui.engine.search.surprise import confirm_surprise
from tuner_tui.engine.search.timing import TrialTimes, stepping
from tuner_tui.engine.search.warming import StepWarming, optimizer_step_variants, variant_label
from tuner_tui.engine.store import REUSABLE as STORE_REUSABLE
from tuner_tui.engine.store import ResultStore, workload_key
from tuner_tui.engine.table import summary

REUSABLE = STORE_REUSABLE + ("stopped",)
"""Statuses of stored trials that a later search reuses: the store's, and a trial stopped early
as clearly slower than the best."""
FIRST_STEPS_MIN = 5
"""The fewest measured steps a trial's first measurement takes (where --steps allows)."""


class Search:
    """One run of the search. `executor` runs the trials (workers by default; a simulated
    machine in the tests), `clock` tells the time (a virtual one in the tests)."""

    def __init__(
        self,
        plan: SearchPlan,
        store: ResultStore,
        out: TextIO = sys.stdout,
        executor: TrialExecutor | None = None,
        clock: Callable[[], float] = time.monotonic,
        references: ReferenceCache | None = None,
        on_trial: Callable[[TrialResult, str], None] | None = None,
        strategy: Callable[["Search"], AnytimeSearch] | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        self.out = out
        environ = {**compile_cache_environ(), **dict(plan.spec.environ)}
        self.spec = replace(plan.spec, environ=tuple(environ.items()))
        self.executor = executor if executor is not None else WorkerExecutor(self.spec)
        self.clock = clock
        self.references = references if references is not None else ReferenceCache()
        self.on_trial = on_trial
        self.make_strategy = strategy
        """Builds the strategy once the space is known (default: the anytime search); the
        simulation compares others under the same driver."""
        self.progress = Progress(out)
        self.counts = {"ran": 0, "reused": 0, "skipped": 0, "error": 0}
        self.order: list[TrialResult] = []
        self.timeline: list[Event] = []
        self.compared: list[TrialResult] = []
        self.out_of_time = False
        self.end_note = ""
        """Why the search ended before its time budget, where it did."""
        self.interrupted = False
        self.error = ""
        self.leaders = LeaderRemeasure(self)
        self.history: History | None = None
        self.startup: dict = {}
        """When the first worker was ready (s from the search's start) and what its start took."""

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        self.deadline = Deadline(self.plan.budget_s, self.plan.trial_timeout_s, self.clock)
        try:
            ready = self.executor.start()
            self.startup = {"ready_s": round(self.elapsed(), 3), **ready.startup_s}
            self._setup(ready)
        except BaseException:
            self.executor.close()
            raise
        try:
            self._search()
        except KeyboardInterrupt:
            # Ctrl-C, SIGTERM or SIGHUP (the CLI raises it for all three): the trial under
            # way is dropped, and what was measured is reported rather than lost.
            self.interrupted = True
            self.say("interrupted: the trials measured so far are reported")
        except Exception as exc:  # a fault of the search itself: what it measured still counts
            self.error = f"{type(exc).__name__}: {exc}"
            self.error_trace = traceback.format_exc()
            self.say(f"the search stopped on an internal error ({self.error}); the trials "
                      "measured so far are reported")
        finally:
            try:
                self._optimizer_steps_reported(last=True)
                if summary := self.executor.native_build_summary():
                    self.say(summary)
            except Exception:  # what it compiled is a note; the report must be written
                pass
            finally:
                self.executor.close()
        return assemble(self)

    def say(self, line: str) -> None:
        try:
            print(line, file=self.out, flush=True)
        except (OSError, ValueError):  # a closed terminal must not lose the report's files
            pass

    def _setup(self, ready) -> None:
        """What the first worker found, checked before any trial: a bad `--set`, `--search` or
        `--compare` is refused here (ConfigError: one line, exit 2)."""
        plan = self.plan
        self.caps = Capabilities(**ready.capabilities)
        self.environment = ready.environment
        self.workload = ready.workload
        self.default_batch = self.workload["default_batch_size"]
        self.workload_key = workload_key(self.workload)
        self.skip = tuple(inapplicable_options(self.workload))
        changes_training = training_changing_options(self.workload)
        self.space = default_space(self.caps, self.default_batch, plan.fixed, plan.choices,
                                   inapplicable=self.skip, changes_training=changes_training)
        start = self.space.start()
        start.check_runnable(self.caps)
        # The batch the devices and the micro-batch must divide is known only now.
        start.accumulation_steps(start.batch_size or self.default_batch)
        check_devices(self.space.devices, self.caps.device, self.environment)
        self.compare = [self._at_run_batch(c) for c in plan.compare]
        for config in self.compare:
            config.check_runnable(self.caps)
            config.accumulation_steps(config.batch_size or self.default_batch)
        # Per device: with several, each rank's peak counts against the budget.
        self.budget_bytes = plan.max_memory_bytes or default_memory_budget(
            self.environment, self.space.devices)
        self.history = History(self.space, self.budget_bytes)
        device = default_memory_budget(self.environment)
        self.refs = References(
            self.references, self.workload_key, self.environment, self.default_batch,
            start.batch_size or self.default_batch, self.history,
            run=lambda config, why, kind="reference": self.evaluate(config, why, kind=kind),
            fits_device=lambda config: self._may_fit(config, device),
            canonical=self.space.canonical)
        ctx = Context(self.caps.device, False, self.default_batch)
        self.priors = Priors(ctx, self.space.canonical, self._store_pairs())
        self.times = TrialTimes(self.caps.device, plan.steps, plan.warmup_steps,
                                default_batch=self.default_batch)
        self.strategy = self.make_strategy(self) if self.make_strategy else AnytimeSearch(
            self.space, ctx, items_per_sample=self.workload.get("items_per_sample") or 1,
            budget_bytes=self.budget_bytes, device_bytes=device, priors=self.priors,
            times=self.times,
            time_available=self._time_available, reference_ready=self.refs.known,
            reference_check_s=self._reference_check_s, remeasure_worth=self._remeasure_worth)
        self.say(f"searching {self.space.describe() or 'one configuration'} "
                  f"(memory budget {fmt.gib(self.budget_bytes)}"
                  + budget_scope(self.caps.device, self.space.devices)
                  + (f", time budget {plan.budget_s / 60:g} min" if plan.budget_s else "") + ")")
        if ready.startup_s:
            self.say(startup_line(self.startup))
        for key in self.space.held:
            self.say(f"not searched: {key}, which would train this model differently: "
                     f"{changes_training[key]} (--search {key}=... tries it anyway)")
        self._warm_optimizer_steps()
        self._build_native()

    def _build_native(self) -> None:
        """On a GPU, the fused kernels' C++ nodes built beside the first trials
        (`engine/native_build.py`), where a kernel set is searched and $GPUTUNE_NATIVE is not
        0: their build is then not charged to the first trial with kernels."""
        if self.caps.device != "cuda" or not kernel_knobs.native_nodes() \
                or not any(self.space.values("fused_kernels")):
            return
        try:
            self.executor.build_native()
        except Exception as exc:  # (the first trial with kernels builds them, as before)
            self.say(f"the fused kernels' C++ build beside the trials could not start: "
                     f"{type(exc).__name__}: {exc}")
            return
        self.say("building the fused kernels' C++ nodes beside the trials")

    def _warm_optimizer_steps(self) -> None:
        """On one GPU, torchao's AdamW steps compiled beside the trials (`warming.py`), unless
        $GPUTUNE_OPTIMIZER_WARMUP is 0."""
        if self.caps.device != "cuda" or self.space.devices != 1 \
                or not kernel_knobs.optimizer_warmup():
            return
        variants = optimizer_step_variants(self.space, self.plan.max_memory_bytes is not None)
        if not variants:
            return
        self.executor.warm_optimizer_steps(variants)
        self.times.warming = StepWarming(variants, self.elapsed())
        self.times.now = self.elapsed
        self.say("compiling torchao's AdamW step beside the trials, for "
                 + ", ".join(variant_label(v) for v in variants))

    def _optimizer_steps_reported(self, last: bool = False) -> None:
        warming = self.times.warming
        if warming is not None:
            warming.report(self.executor.optimizer_steps_compiled(), self.elapsed(),
                           self.executor.optimizer_steps_notes())
            if last:
                self.say(warming.summary())

    def _store_pairs(self):
        """What this machine's store has measured of each lever, on any workload."""
        try:
            rows = self.store.past(self.environment, limit=2000)
        except Exception:  # a store that cannot be read teaches nothing; it never stops a search
            return []
        by_key: dict[str, list[TrialResult]] = {}
        for row in rows:
            by_key.setdefault(row.workload, []).append(row.result)
        large = {key: (None if (n := parameter_count(rs)) is None else n >= LARGE_MODEL)
                 for key, rs in by_key.items()}
        try:
            return store_pairs(((row.workload, row.result) for row in rows), self.workload_key,
                               False, self.space.canonical, lambda key: large.get(key))
        except Exception:
            return []

    def _search(self) -> None:
        for config in self.compare:
            self.compared.append(self.evaluate(self.space.canonical(config), "--compare",
                                               kind="compare"))
        while True:
            # Once the time budget has ended nothing more starts (the leaders' note is still made).
            self._optimizer_steps_reported()
            proposal = None if self._time_out() else self.strategy.next(self.history)
            if proposal is None:
                if self.leaders.due() and self.leaders.run():
                    continue  # the time left after it goes back to the search
                break
            result = self.evaluate(proposal.config, proposal.why, proposal=proposal)
            result = confirm_surprise(self, proposal, result)
            self._check_later(proposal.config, result)
            no_losses = not (result.status == "ok" and result.losses)
            if proposal.config == self.space.start() and no_losses and not self._time_out():
                # The baseline gave no losses (and perhaps no peak): the reference runs now, so
                # that the expert's recipe is fitted to the budget from a measured peak.
                self.refs.for_config(self.space.start().replace(precision="bf16")
                                    if "bf16" in self.space.values("precision")
                                    else self.space.start().replace(compile_mode="default"))
        if self.plan.budget_s and self.time_left() < self._typical_trial_s():
            self.out_of_time = True
        elif self.plan.budget_s and self.strategy.ended:
            self.end_note = (f"ended {fmt.clock(self.time_left())} before its time budget: "
                             f"{self.strategy.ended}")

    def _learn_size(self) -> None:
        """Once a trial counted the parameters: the priors of large models apply, or not."""
        n = parameter_count(self.history.all())
        if n is not None and self.times.params is None:
            self.times.params = n
            ctx = Context(self.caps.device, n >= LARGE_MODEL, self.default_batch)
            self.priors.ctx = ctx
            self.strategy.ctx = ctx

    # -- time ----------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.deadline.elapsed()

    def time_left(self) -> float:
        return self.deadline.time_left()

    def timeout(self, expected_s: float, by_budget_end: bool = False,
                one_time_s: float = 0.0) -> float:
        return self.deadline.timeout(expected_s, by_budget_end, one_time_s)

    def _time_out(self) -> bool:
        """The time budget has ended: nothing more starts."""
        return bool(self.plan.budget_s) and self.time_left() <= 0

    def _time_available(self) -> float | None:
        """Seconds the next trial may take: the time left less what re-measuring the leaders
        will need, where it can still be done (None without a time budget)."""
        if not self.plan.budget_s:
            return None
        left = self.time_left()
        return left - self.leaders.reserve_s(left)

    def _remeasure_worth(self) -> tuple[float, float] | None:
        """What the leaders' re-measure still due is worth and takes (`LeaderRemeasure.worth`;
        None without a time budget)."""
        return self.leaders.worth(self.time_left()) if self.plan.budget_s else None

    def _typical_trial_s(self) -> float:
        walls = [e.ended_s - e.started_s for e in self.timeline if e.how == "ran"]
        return statistics.median(walls) if walls else 0.0

    # -- one configuration -----------------------------------------------------------------------
    def evaluate(self, config: TuneConfig, why: str, kind: str = "trial",
                 proposal: Proposal | None = None, steps: int | None = None) -> TrialResult:
        """Decide one configuration: reuse it from this search or the store, or run it in a
        fresh worker. Whatever goes wrong becomes its row."""
        done = self.history.get(config)
        if done is not None:
            return done
        began = self.elapsed()
        try:
            result, how = self._decide(config, why, proposal, steps)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            self.end_line(f"error: {type(exc).__name__}: {exc}")
            result, how = error_row(config, exc), "error"
        ended = self.elapsed()
        self.history.add(config, result)
        self.order.append(result)
        self.counts[how] = self.counts.get(how, 0) + 1
        if how == "ran":
            try:
                self.strategy.observe(config, result, ended - began, self.history)
            except Exception:  # learning from a trial is a saving, never a failure
                pass
        self.refs.keep(config, result)
        self._mark_lost()
        phases = result.phases_s if how == "ran" else {}
        result = self.history.get(config) or result
        self._learn_size()
        self.timeline.append(Event(len(self.timeline) + 1, kind, result.label, result.status, how,
                                   why, began, ended, result.tokens_per_s, *self.best_now(),
                                   phases_s=phases))
        if self.on_trial is not None:
            self.on_trial(result, how)
        return result

    def best_now(self) -> tuple[str | None, float | None]:
        top = self.history.best() if self.history is not None else None
        return (top.label, top.tokens_per_s) if top is not None else (None, None)

    def _decide(self, config: TuneConfig, why: str, proposal: Proposal | None,
                steps: int | None) -> tuple[TrialResult, str]:
        steps = self.steps_for(config) if steps is None else steps
        stored = None if self.plan.fresh else self.store.lookup(
            self.workload_key, config.to_dict(), steps, self.plan.warmup_steps, self.environment)
        # With --profile, a stored row that ran without a profile is measured again, with one.
        unprofiled = (self.plan.profile_steps and stored is not None
                      and stored.result.status == "ok" and not stored.result.profile)
        if stored is not None and stored.result.status in REUSABLE and not unprofiled:
            self.begin(config, why)
            self.end_line("skipped as measured (in the store): " + summary(stored.result))
            return stored.result, "reused"
        estimated = estimate_or_none(config, self.history.all(), self.default_batch)
        reference = self.refs.for_config(config)
        self.begin(config, why)
        seconds = proposal.trial_s if proposal is not None and proposal.trial_s else \
            self.times.trial_s(config, None)
        # (a cold estimate past the time left: let in on a compile from the cache, `anytime`)
        # Timed out as if torchao's step compile were all its own: the optimizer steps' worker
        # may not have compiled it by then.
        seconds += self.times.one_time_s(config, worst=True) - self.times.one_time_s(config)
        once = min(seconds, self.times.one_time_s(config, worst=True))
        # Let in past the budget's end only as a plan without the one-time cost would be: that
        # cost decides what starts (`anytime`), not how long a started trial may run (with it, an
        # eager recipe that fitted before was cut at the budget's end, the search's only answer).
        by_budget_end = seconds - once > self.time_left()
        guessed = not any(r.step_ms for r in self.history.all())
        timeout = self.deadline.timeout(seconds, by_budget_end, once, guessed)
        # A model slower than planned runs on while its steps come, up to this (`step_pace`).
        limit = self.deadline.limit(seconds, by_budget_end)
        result = self.deadline.cut_short(
            self.run_trial(config, reference, steps, timeout=timeout, limit=limit), timeout,
            seconds, once, limit)
        if estimated is None:  # nothing measured before it: from what its worker counted
            estimated = prior_estimate(config, result, self.default_batch)
        if estimated is not None:
            result = replace(result, memory_estimate=estimated.to_dict())
        self.store.record(result, self.environment, self.workload_key, steps,
                          self.plan.warmup_steps)
        self.end_line(summary(result) + _compile_note(result))
        return result, "ran"

    def _may_fit(self, config: TuneConfig, device_bytes: int) -> bool:
        return reference_may_fit(config, self.history.all(), self.default_batch, device_bytes)

    def begin(self, config: TuneConfig, why: str) -> None:
        index = len(self.order) + 1
        best_now = self.history.best()
        note = fmt.clock(self.elapsed())
        if self.plan.budget_s:
            note += f" of {fmt.clock(self.plan.budget_s)}"
        if best_now is not None:
            note += f", best {fmt.si(best_now.tokens_per_s)} {best_now.item_name}/s"
        total = self._estimated_total(index)
        try:
            self.progress.begin(index, total, config.label(skip=self.skip), f"{note}; {why}")
        except (OSError, ValueError):
            pass

    def end_line(self, text: str) -> None:
        try:
            self.progress.end(text)
        except (OSError, ValueError):
            pass

    def _estimated_total(self, index: int) -> str:
        """The trials this search will likely run, as the progress line counts them: this one
        and the moves the strategy still holds worth a trial, as far as the time left holds
        them at the typical trial's length; "?" while the strategy cannot tell yet (in the
        opening: its baseline's few seconds said nothing of a compiled trial's minutes)."""
        pool = self.strategy.remaining(self.history)
        if pool is None:
            return "?"
        return f"~{index + max(0, min(pool, self._trials_left()))}"

    def _trials_left(self) -> int:
        typical = self._typical_trial_s()
        left = self.time_left()
        if math.isinf(left) or not typical:
            return 1_000_000
        return int(max(0.0, left) // typical)

    def steps_for(self, config: TuneConfig) -> int:
        """Measured steps for this trial: half the plan's (the leaders are measured again in
        full, interleaved: a short first measurement for every candidate, a full one for the
        contenders). A configuration that computes the fp32 reference (the baseline, a
        reference run) runs only for its losses and a first figure, so it stops once it has the
        steps the loss check compares: fp32 eager is the slowest configuration of all (a 1.3B
        Llama: 1.6 s a step on an H200), and never the answer."""
        if computes_reference(config):
            return max(1, min(self.plan.steps, LOSS_CHECK_STEPS - self.plan.warmup_steps))
        return max(min(self.plan.steps, FIRST_STEPS_MIN), self.plan.steps // 2)

    def run_trial(self, config: TuneConfig, reference: tuple[float, ...], steps: int,
             early_stop: bool = True, timeout: float | None = None,
             limit: float | None = None) -> TrialResult:
        # Its losses are compared with the reference's now, or after it ran if it wins,
        # unless the same numerics kept the loss at another batch.
        compared = bool(reference) or computes_reference(config) or self.refs.check_pending(config)
        warmup, steps = stepping(config, self.plan.warmup_steps, steps, self.default_batch,
                                 LOSS_CHECK_STEPS if compared else 0)
        plan = TrialPlan(steps=steps, warmup_steps=warmup,
                         trial_timeout_s=timeout or self.plan.trial_timeout_s, limit_s=limit,
                         profile_steps=self.plan.profile_steps,
                         trace_path=trace_path(self.plan.trace_dir, len(self.order) + 1, config))
        stop_ms = self._early_stop_ms(config, reference) if early_stop else None
        return self.executor.run(config, plan, reference, self.progress, stop_ms,
                                 str(self.refs.entry(config)))

    def _at_run_batch(self, config: TuneConfig) -> TuneConfig:
        """A compared file that leaves the batch at the workload's default (0) trains at this
        run's batch (`--set batch_size=...`): a different batch is a different training run, so
        its speed would not compare. A file that names its batch keeps it."""
        if config.batch_size:
            return config
        return config.replace(batch_size=self.space.start().batch_size)

    def _early_stop_ms(self, config: TuneConfig, reference: tuple[float, ...]) -> float | None:
        """The step time above which this configuration is clearly slower than the best so far;
        None for reference runs (their losses are needed whole)."""
        top = self.history.best()
        if top is None or not reference:
            return None
        batch = config.batch_size or self.default_batch
        tokens_per_step = batch * self.workload["items_per_sample"]
        return tokens_per_step / (top.tokens_per_s / self.plan.early_stop_ratio) * 1e3

    def _reference_check_s(self, config: TuneConfig) -> float:
        """What checking `config`'s loss after it ran would take: the fp32 reference at its
        batch (0 where none is needed)."""
        if not self.refs.check_pending(config):
            return 0.0
        return self.times.reference_s(self.refs.fp32_step_s(config.batch_size or self.default_batch))

    def _check_later(self, config: TuneConfig, result: TrialResult) -> None:
        """The best's loss checked after it ran, where it ran without the reference's."""
        left = self.time_left() if self.plan.budget_s else float("inf")
        checked = self.refs.check_later(config, result, left, self.times.reference_s)
        if checked is None:
            return
        if self.history.get(config) is result:  # (not judged already, by a probe's trial)
            self._judged(config, result, checked)
            self._mark_lost()  # (a loss lost now may judge other rows that ran unchecked)
        top = self.history.best()
        if not checked.loss_ok and top is not None and top.loss_ok is None:
            # The lead passed to a row that ran unchecked while another led: it is checked now
            # (a simulated search recommended float8 that way, after its leader lost the loss).
            self._check_later(top.tune_config, top)

    def _mark_lost(self) -> None:
        """Rows that ran without their loss compared, with values that change the numerics
        which lost the loss in another trial, are marked as lost (`References.lost_unchecked`),
        whichever trial ran last: never recommended unchecked, and learned from as lost."""
        try:
            found = self.refs.lost_unchecked()
        except Exception:  # a judgement that cannot be made leaves the rows as they ran
            return
        for row, lost in found:
            self._judged(row.tune_config, row, lost_with(row, lost))

    def _judged(self, config: TuneConfig, result: TrialResult, judged: TrialResult) -> None:
        """A row's loss judged after it ran: the row is `judged` from now on, and the strategy
        learns what the judgement says of its numerics."""
        self.supersede(config, result, judged)
        try:
            self.strategy.observe_check(config, judged)
        except Exception:  # learning from a check is a saving, never a failure
            pass

    def supersede(self, config: TuneConfig, result: TrialResult, later: TrialResult) -> None:
        """`config`'s row is `later` from now on, where it was `result`."""
        self.history.add(config, later)
        self.order = [later if r is result else r for r in self.order]


def _compile_note(result: TrialResult) -> str:
    if result.status in ("ok", "stopped") and result.compile_s is not None:
        return f", first step {result.compile_s:.1f} s"
    return ""


def default_memory_budget(environment: dict, devices: int = 1) -> int:
    """One GPU's memory; on the CPU the available RAM, shared by the group's processes."""
    if environment.get("gpu_memory_bytes"):
        return int(environment["gpu_memory_bytes"])
    import psutil

    return int(psutil.virtual_memory().available) // devices


def check_devices(devices: int, device: str, environment: dict) -> None:
    """Refuse more GPUs than the machine has, before any trial."""
    count = environment.get("gpu_count") or 0
    if device == "cuda" and devices > count:
        raise ConfigError(f"devices = {devices} but this machine has {count} GPU(s): allowed "
                          f"devices are 1 to {count}")


__all__ = ["REUSABLE", "Search", "SearchPlan", "check_devices", "compile_cache_environ",
           "default_memory_budget", "measured_peak", "workload_key"]

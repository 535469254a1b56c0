"""`gputune tune`: search the configurations for the fastest one that keeps the loss.

The search runs in the parent process, which imports no torch. Every trial runs in a fresh worker
process (`runner.run_one`), so a trial that runs out of memory, diverges, fails to compile or
kills its process is marked and the search goes on. Around the trials:

- the space (`space.py`): each option restricted to what this machine can run;
- a strategy (`staged.py`) proposes configurations in rounds from the results so far;
- a memory budget: a trial whose estimated peak (`memory.estimate_peak`) exceeds it is skipped
  before it runs; a time budget: no trial starts after it;
- early stop: a trial clearly slower than the best so far is stopped after a few measured steps;
- the result store: a trial measured before on this machine is reused, not run again;
- one Inductor cache directory under the gputune home shared by every trial;
- a correctness gate: only a trial that ran (`ok`), kept the fp32 reference's loss and its
  first-step gradients can be recommended (`report.py` says why it won);
- the leaders re-measured interleaved before the winner is named (`remeasure.py`): a difference
  within the spread is a tie, won by the simpler configuration.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable, TextIO

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui import format as fmt
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.progress import Progress
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine import remeasure
from tuner_tui.engine.reference import (
    LOSS_CHECK_STEPS, computes_reference, reference_configs, reference_key,
)
from tuner_tui.engine.runner import (
    NextWorker, TrialPlan, WorkerStartError, best, run_one, start_worker, trace_path,
)
from tuner_tui.engine.search.memory import (
    SKIP_MARGIN, checkpoint_ratios, estimate, estimate_peak, measured_peak, micro_batch,
    pareto_front, prior_estimate,
)
from tuner_tui.engine.search.report import SearchOutcome, budget_scope, explain
from tuner_tui.engine.search.space import SearchSpace, default_space
from tuner_tui.engine.search.staged import History, SearchStrategy, StagedSearch
from tuner_tui.engine.paths import compile_cache_environ
from tuner_tui.engine.store import REUSABLE as STORE_REUSABLE
from tuner_tui.engine.store import ResultStore, workload_key
from tuner_tui.engine.table import summary

TRIAL_GRACE_S = 300.0
"""The least time a trial started inside the time budget is given before it is stopped."""

REUSABLE = STORE_REUSABLE + ("stopped",)
"""Statuses of stored trials that a later search reuses: the store's, and a trial stopped early
as clearly slower than the best."""

@dataclass
class SearchPlan:
    spec: WorkerSpec
    steps: int = 20
    warmup_steps: int = 5
    max_memory_bytes: int | None = None
    """None: the GPU's memory, or the available RAM on the CPU."""
    budget_s: float | None = None
    """No trial starts after this many seconds; None: no limit."""
    trial_timeout_s: float = 900.0
    fixed: dict = field(default_factory=dict)
    """Options held at one value (`--set`)."""
    choices: dict = field(default_factory=dict)
    """Candidate values replacing the default ones per option (`--search`)."""
    compare: list = field(default_factory=list)
    """Configurations (TuneConfig) measured first, side by side with the search, such as the
    one the user trains with now; the report gives the recommendation's speed against each."""
    profile_steps: int = 0
    """Steps profiled after each trial's measured ones (`--profile`); 0: none. The stages
    then go first to what addresses the best's bottleneck (`StagedSearch`)."""
    trace_dir: str | None = None
    early_stop_ratio: float = 1.5
    """A trial whose throughput after a few steps is below the best's divided by this stops."""
    early_stop_after: int = 3
    remeasure_repeats: int = remeasure.REPEATS
    """Interleaved runs per leader before the winner is named; 0: none."""
    fresh: bool = False
    """Measure every trial again: stored results are not reused (new ones are still stored)."""


class Search:
    """One run of the search. `runner` runs one trial in a worker (run_one; tests count
    the trials through it)."""

    def __init__(
        self,
        plan: SearchPlan,
        store: ResultStore,
        out: TextIO = sys.stdout,
        strategy: Callable[[SearchSpace], SearchStrategy] = StagedSearch,
        runner: Callable[..., TrialResult] = run_one,
        on_trial: Callable[[TrialResult, str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        self.out = out
        self.make_strategy = strategy
        self.runner = runner
        self.on_trial = on_trial
        self.progress = Progress(out)
        environ = {**compile_cache_environ(), **dict(plan.spec.environ)}
        self.spec = replace(plan.spec, environ=tuple(environ.items()))
        self.counts = {"ran": 0, "reused": 0, "skipped": 0}
        self.order: list[TrialResult] = []
        self.out_of_time = False
        self.interrupted = False
        self._next = NextWorker(self.spec)
        self.compared: list[TrialResult] = []
        self._pending = 0
        self.verdict: remeasure.Verdict | None = None
        self.remeasure_note = ""
        self.wall_s: dict[str, float] = {}
        """Each trial's wall time in this search (worker start, compile and steps), by label:
        what re-measuring it would cost, which the time budget keeps in reserve."""

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        self.started = time.monotonic()
        client, ready = start_worker(self.spec)
        self._next.keep(client, ready)  # the first trial runs in the worker that described the machine
        try:
            self.caps = Capabilities(**ready.capabilities)
            self.environment = ready.environment
            self.workload = ready.workload
            self.default_batch = self.workload["default_batch_size"]
            self.workload_key = workload_key(self.workload)
            self.space = default_space(
                self.caps, self.default_batch, self.plan.fixed, self.plan.choices
            )
            start = self.space.start()
            start.check_runnable(self.caps)
            # The batch the devices and the micro-batch must divide is known only now.
            start.accumulation_steps(start.batch_size or self.default_batch)
            check_devices(self.space.devices, self.caps.device, self.environment)
            # Per device: with several, each rank's peak counts against the budget.
            self.budget_bytes = (
                self.plan.max_memory_bytes
                or default_memory_budget(self.environment, self.space.devices)
            )
            self.history = History(self.space, self.budget_bytes)
            self.strategy = self.make_strategy(self.space)
            print(f"searching {self.space.describe() or 'one configuration'} "
                  f"(memory budget {fmt.gib(self.budget_bytes)}"
                  + budget_scope(self.caps.device, self.space.devices)
                  + (f", time budget {self.plan.budget_s / 60:g} min" if self.plan.budget_s else "")
                  + ")", file=self.out, flush=True)
            compare = [self._at_run_batch(c) for c in self.plan.compare]
            for config in compare:
                config.check_runnable(self.caps)
            try:
                self._search(compare)
            except KeyboardInterrupt:
                # Ctrl-C, SIGTERM or SIGHUP (the CLI raises it for all three): the trial under
                # way is dropped, and what was measured is reported rather than lost.
                self.interrupted = True
                print("interrupted: the trials measured so far are reported", file=self.out,
                      flush=True)
        finally:
            self._next.close()
        return self._outcome()

    def _search(self, compare: list[TuneConfig]) -> None:
        """The compared configurations, the strategy's rounds until done or out of time, then
        the leaders re-measured."""
        self.compared = [self.evaluate(self.space.canonical(c), aside=True) for c in compare]
        while not self.out_of_time:
            round_ = self.strategy.propose(self.history)
            if not round_:
                break
            for i, config in enumerate(round_):
                self._pending = len(round_) - i - 1
                reserve = self._reserve()
                if self._time_left() <= reserve:
                    self.out_of_time = True
                    kept = (f" (the last {fmt.clock(reserve)} kept for a trial and re-measuring "
                            "the leaders)" if reserve else "")
                    print(f"time budget of {self.plan.budget_s / 60:g} min reached{kept}; "
                          "the remaining trials were not run", file=self.out, flush=True)
                    break
                self.evaluate(config, use_estimate=not self.strategy.must_run(config))
        self.verdict = self._remeasure_leaders()

    def _reserve(self) -> float:
        """Seconds the time budget must hold for the next trial to start: the trial and the
        re-measurement of the leaders it may join (`remeasure.reserve_s`); 0 without a budget
        or a re-measure."""
        if not self.plan.budget_s or self.plan.remeasure_repeats < 1:
            return 0.0
        return remeasure.reserve_s(self.history.eligible(), self.wall_s,
                                   self.plan.remeasure_repeats)

    def _time_left(self) -> float:
        if not self.plan.budget_s:
            return math.inf
        return self.plan.budget_s - (time.monotonic() - self.started)

    def evaluate(self, config: TuneConfig, use_estimate: bool = True, aside: bool = False,
                 limit: int | None = None) -> TrialResult:
        """Decide one configuration: reuse it from this search or the store, skip it by the
        memory estimate (against `limit`, by default the budget), or run it in a fresh worker."""
        done = self.history.get(config)
        if done is not None:
            return done
        steps = self._steps_for(config)
        stored = None if self.plan.fresh else self.store.lookup(
            self.workload_key, config.to_dict(), steps, self.plan.warmup_steps, self.environment)
        # With --profile, a stored row that ran without a profile is measured again, with one.
        unprofiled = (self.plan.profile_steps and stored is not None
                      and stored.result.status == "ok" and not stored.result.profile)
        if stored is not None and stored.result.status in REUSABLE and not unprofiled:
            self._begin(config)
            self.progress.end(
                "skipped as measured (in the store): " + summary(stored.result)
            )
            return self._decided(config, stored.result, "reused", aside)
        # The estimate first: a configuration that will not run needs no reference either.
        # It skips only what is clearly over (SKIP_MARGIN); near the limit the trial runs.
        limit = self.budget_bytes if limit is None else limit
        estimated = estimate(config, self.history.all(), self.default_batch)
        if use_estimate and self._clearly_over(estimated, limit):
            return self._skip(config, estimated, limit, aside)
        reference = self._reference_for(config)
        if estimated is None:
            # The reference was the first trial measured: the estimate can start from it (else
            # the search's first candidate ran with none, seen on the H200).
            estimated = estimate(config, self.history.all(), self.default_batch)
            if use_estimate and self._clearly_over(estimated, limit):
                return self._skip(config, estimated, limit, aside)
        self._begin(config)
        began = time.monotonic()
        result = self._run(config, reference, steps)
        self.wall_s[result.label] = time.monotonic() - began
        if estimated is None:  # nothing measured before it: from what its worker counted
            estimated = prior_estimate(config, result, self.default_batch)
        if estimated is not None:
            result = replace(result, memory_estimate=estimated.to_dict())
        self.store.record(result, self.environment, self.workload_key, steps,
                          self.plan.warmup_steps)
        self.progress.end(summary(result) + _compile_note(result))
        return self._decided(config, result, "ran", aside)

    @staticmethod
    def _clearly_over(estimated, limit: int) -> bool:
        return (estimated is not None and estimated.certain
                and estimated.total > limit * SKIP_MARGIN)

    def _skip(self, config: TuneConfig, estimated, limit: int, aside: bool) -> TrialResult:
        result = TrialResult(
            config=config.to_dict(), label=config.label(), status="skipped",
            workload=self.workload["name"], device=self.caps.device,
            batch_size=config.batch_size or self.default_batch,
            memory_estimate=estimated.to_dict(),
            message=f"estimated peak {fmt.gib(estimated.total)} > memory budget "
                    f"{fmt.gib(limit)}{budget_scope(self.caps.device, config.devices)} by "
                    f"more than {SKIP_MARGIN - 1:.0%}",
        )
        self._begin(config)
        self.progress.end(f"skipped: {result.message}")
        return self._decided(config, result, "skipped", aside)

    def _begin(self, config: TuneConfig) -> None:
        index = len(self.order) + 1
        total = index + self._pending + self.strategy.remaining(self.history)
        best = self.history.best()
        note = fmt.clock(time.monotonic() - self.started) + " elapsed"
        if best is not None:
            note += f", best {fmt.si(best.tokens_per_s)} tokens/s"
        self.progress.begin(index, total, config.label(), note)

    def _decided(self, config: TuneConfig, result: TrialResult, how: str,
                 aside: bool = False) -> TrialResult:
        self.history.add(config, result, aside)
        self.order.append(result)
        self.counts[how] += 1
        if self.on_trial is not None:
            self.on_trial(result, how)
        return result

    def _steps_for(self, config: TuneConfig) -> int:
        """Measured steps for this trial. The fp32 reference of a batch size other than the
        baseline's is run only for its losses, so it stops once it has the steps the loss check
        compares (with fp32 eager at a large batch, a full trial would cost tens of seconds)."""
        start_batch = self.space.start().batch_size
        if config.batch_size != start_batch and computes_reference(config):
            return max(1, min(self.plan.steps, LOSS_CHECK_STEPS - self.plan.warmup_steps))
        return self.plan.steps

    def _run(self, config: TuneConfig, reference: tuple[float, ...], steps: int,
             early_stop: bool = True) -> TrialResult:
        try:
            client, _ = self._next.take()
        except WorkerStartError as exc:
            return TrialResult(config=config.to_dict(), label=config.label(), status="crash",
                               message=f"the worker did not start: {exc}")
        # The next trial's worker starts now; this trial's measured steps wait until it is up.
        self._next.begin(client)
        # A trial that starts inside the time budget may finish past it: cut at the budget's
        # end, a compiled trial of a large batch would be lost (seen on the H200: an HF Llama
        # at batch 16 killed after 60 s, its fp32 reference too).
        timeout = min(self.plan.trial_timeout_s, max(self._time_left(), TRIAL_GRACE_S))
        plan = TrialPlan(steps=steps, warmup_steps=self.plan.warmup_steps,
                         trial_timeout_s=timeout, profile_steps=self.plan.profile_steps,
                         trace_path=trace_path(self.plan.trace_dir, len(self.order) + 1, config))
        try:
            stop_ms = self._early_stop_ms(config, reference) if early_stop else None
            return self.runner(client, config, plan, reference, self.progress,
                               stop_if_slower_than_ms=stop_ms)
        finally:
            client.stop()

    def _at_run_batch(self, config: TuneConfig) -> TuneConfig:
        """A compared file that leaves the batch at the workload's default (0) trains at this
        run's batch (`--set batch_size=...`): a different batch is a different training run, so
        its speed would not compare (seen on the H200: lever files at batch 2 beside a search at
        batch 4). A file that names its batch keeps it, and its label says so."""
        if config.batch_size:
            return config
        return config.replace(batch_size=self.space.start().batch_size)

    def _remeasure_leaders(self) -> remeasure.Verdict | None:
        """The leaders run again, interleaved, with few steps and no early stop; their losses
        and gradients were checked on the first run (the gradients are checked again)."""
        leading = remeasure.leaders(self.history.eligible())
        if self.plan.remeasure_repeats < 1 or len(leading) < 2:
            return None
        if self.plan.budget_s:
            # Within the time budget: the leaders whose repeats fit in what is left, best first,
            # with half a trial's slack (the search's last trial may have run a little over).
            left = self._time_left() + 0.5 * remeasure.expected_s(leading[0], self.wall_s)
            fitting = remeasure.within_time(leading, self.wall_s, self.plan.remeasure_repeats, left)
            if len(fitting) < len(leading):
                needed = remeasure.cost_s(leading, self.wall_s, self.plan.remeasure_repeats)
                left_now = fmt.clock(max(0.0, self._time_left()))
                self.remeasure_note = (
                    f"time budget: the leaders were not re-measured ({left_now} left, about "
                    f"{fmt.clock(needed)} needed); the first measurements decide" if not fitting else
                    f"time budget: the best {len(fitting)} of {len(leading)} leaders re-measured "
                    f"({left_now} left); the others were left out")
                print(self.remeasure_note, file=self.out, flush=True)
            if not fitting:
                return None
            leading = fitting
        steps = remeasure.repeat_steps(self.plan.steps)

        def run(config: TuneConfig, index: int, total: int) -> TrialResult:
            self.progress.begin(index, total, config.label(), "re-measuring the leaders, interleaved")
            result = self._run(config, (), steps, early_stop=False)
            self.progress.end(summary(result))
            return result

        verdict = remeasure.remeasure(leading, run, self.plan.remeasure_repeats)
        if verdict is not None:
            print(verdict.text(), file=self.out, flush=True)
        return verdict

    def _early_stop_ms(self, config: TuneConfig, reference: tuple[float, ...]) -> float | None:
        """The step time above which this configuration is clearly slower than the best so far;
        None for reference runs (their losses are needed whole) and short trials."""
        best = self.history.best()
        if best is None or not reference or self.plan.steps <= self.plan.early_stop_after:
            return None
        batch = config.batch_size or self.default_batch
        tokens_per_step = batch * self.workload["items_per_sample"]
        slowest_tokens_per_s = best.tokens_per_s / self.plan.early_stop_ratio
        return tokens_per_step / slowest_tokens_per_s * 1e3

    def _reference_for(self, config: TuneConfig) -> tuple[float, ...]:
        """The fp32 eager losses for this configuration's batch size and gradient clipping: from
        any measured run that computes the reference (the baseline, say), else from
        `TuneConfig.reference` run first (with full checkpointing, which leaves the losses
        unchanged, when plain would not fit). () for a configuration that is its own reference,
        or when no reference could run."""
        if computes_reference(config):
            return ()
        for result in self.history.all():
            done = result.tune_config
            if (result.status == "ok" and result.losses and computes_reference(done)
                    and reference_key(done, 0) == reference_key(config, 0)):
                return tuple(result.losses[:LOSS_CHECK_STEPS])
        # A reference is run for its losses, not recommended for its memory: the limit is what
        # the device holds, not the budget (a search for a 24 GiB card on a larger GPU checks
        # its configurations against an fp32 reference that needs more than 24 GiB).
        device = default_memory_budget(self.environment)
        first = reference_configs(config)[0]
        for reference in reference_configs(config):
            result = self.history.get(reference)
            if result is None:
                # Checkpointing's saving is estimated from measured pairs; with none measured the
                # estimate assumes no saving, so the checkpointed reference is tried instead (an
                # OOM costs one short trial; an unchecked loss would cost the correctness gate).
                trust = reference == first or self._checkpoint_saving_measured("full")
                estimated = estimate_peak(reference, self.history.all(), self.default_batch)
                if trust and estimated is not None and estimated > device:
                    continue
                result = self.evaluate(reference, use_estimate=trust, limit=device)
            if result.status == "ok" and result.losses:
                return tuple(result.losses[:LOSS_CHECK_STEPS])
        return ()

    def _checkpoint_saving_measured(self, mode: str) -> bool:
        known = [(r.tune_config, r) for r in self.history.all() if measured_peak(r)]
        return bool(checkpoint_ratios(mode, known, lambda c: micro_batch(c, self.default_batch)))

    # -- the outcome ---------------------------------------------------------------------------
    def _outcome(self) -> SearchOutcome:
        results = list(self.order)
        eligible = self.history.eligible()
        ranked = sorted(eligible, key=lambda r: -r.tokens_per_s)
        ranked += [r for r in results if not any(r is x for x in ranked)]
        top = best(eligible)
        if self.verdict is not None and self.verdict.winner is not None:
            top = self.verdict.winner
        outcome = SearchOutcome(
            results=results, ranked=ranked, eligible=len(eligible), front=pareto_front(eligible),
            recommendation=top,
            reason="", environment=self.environment, workload=self.workload,
            workload_key=self.workload_key, space=self.space, budget_bytes=self.budget_bytes,
            ran=self.counts["ran"], reused=self.counts["reused"], skipped=self.counts["skipped"],
            out_of_time=self.out_of_time, interrupted=self.interrupted,
            elapsed_s=time.monotonic() - self.started,
            compared=list(self.compared), steps=self.plan.steps,
            warmup_steps=self.plan.warmup_steps, remeasured=self.verdict,
            remeasure_note=self.remeasure_note,
        )
        outcome.reason = explain(outcome)
        return outcome


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

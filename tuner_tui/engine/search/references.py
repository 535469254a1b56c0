"""The fp32 reference's losses for one search: what every trial's loss is checked against.

They come from this search (a run that computes them: the baseline), the reference cache on disk
(`reference_cache.py`: a search before this one), or a reference run now (fp32, eager, SDPA; with
full checkpointing, then one sample at a time, where the device would not hold it). At a batch
other than the run's, the reference runs only for a trial that becomes the best, and that trial's
losses are checked after it ran (`check_later`), unless the same numerics kept the loss at
another batch; after every trial, a row that ran unchecked with the values that lost the loss in
another trial is marked as lost without a run (`lost_unchecked`). Torch-free.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Callable

from strategies.config import TuneConfig
from strategies.registry import NUMERICS, numerics_class
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import (
    LOSS_CHECK_STEPS, check_losses, computes_reference, reference_configs, reference_key,
)
from tuner_tui.engine.reference_cache import ReferenceCache
from tuner_tui.engine.search.history import History
from tuner_tui.engine.search.priors import numerics_values

LOST_LOSS = ("loss-mismatch", "numerics")
"""How a trial that lost the reference's loss ends (a NaN, "diverged", is not checked here: it
shows in its own losses)."""

Key = tuple[int, float]
"""Batch size and gradient clipping: what a reference's losses depend on."""


class References:
    def __init__(self, cache: ReferenceCache, workload_key: str, environment: dict,
                 default_batch: int, run_batch: int, history: History,
                 run: Callable[..., TrialResult],
                 fits_device: Callable[[TuneConfig], bool],
                 canonical: Callable[[TuneConfig], TuneConfig] = lambda config: config) -> None:
        self.cache = cache
        self.workload_key = workload_key
        self.environment = environment
        self.default_batch = default_batch
        self.run_batch = run_batch
        """The batch of the search's start: its reference runs at once, others only if needed."""
        self.history = history
        self.run = run
        """Runs a configuration as a trial of its own (a row of the search): `run(config, why,
        kind="reference")`."""
        self.fits_device = fits_device
        self.canonical = canonical
        """The search space's one configuration per distinct run: a rung of the reference's
        ladder that changes nothing in the model (SDPA without attention, checkpointing without
        blocks) is the rung before it, or the baseline, and is not run twice."""
        self.losses: dict[Key, tuple[float, ...]] = {}
        self.unchecked_note = ""
        self._entries: dict[Key, Path] = {}

    def _trials(self) -> "_Trials":
        """What the checks read from the trials, read once per change of the history (they
        are asked of every candidate and every row after every trial)."""
        return self.history.derived("reference checks", lambda: _Trials(self.history.all()))

    def key(self, config: TuneConfig) -> Key:
        return reference_key(config, self.default_batch)

    def entry(self, config: TuneConfig):
        """The reference cache's folder for `config`'s batch and clipping."""
        key = self.key(config)
        if key not in self._entries:  # (asked of every candidate: its hash is computed once)
            self._entries[key] = self.cache.entry(self.workload_key, self.environment, *key)
        return self._entries[key]

    def known(self, config: TuneConfig) -> bool:
        """Whether a trial of `config` will not wait for a reference run first."""
        key = self.key(config)
        if key[0] != self.run_batch:
            return True  # checked later, and only if it wins
        return key in self.losses or self.cache.losses(self.entry(config)) is not None

    def check_pending(self, config: TuneConfig) -> bool:
        """Whether a trial of `config` that wins will need the reference run at its batch (its
        own batch is not the run's, no losses are known there, and no trial of the same numerics
        kept the loss elsewhere)."""
        key = self.key(config)
        if computes_reference(config) or key[0] == self.run_batch or key in self.losses:
            return False
        return self.cache.losses(self.entry(config)) is None and not self.checked_elsewhere(config)

    def keep(self, config: TuneConfig, result: TrialResult) -> None:
        """A run that computes the reference keeps its losses for every later trial and search."""
        if not (computes_reference(config) and result.status == "ok" and result.losses):
            return
        key = self.key(config)
        if key in self.losses:
            return
        losses = tuple(result.losses[:LOSS_CHECK_STEPS])
        self.losses[key] = losses
        if self.cache.losses(self.entry(config)) is None:
            self.cache.save_losses(self.entry(config), losses, result.label)

    def for_config(self, config: TuneConfig, now: bool = False) -> tuple[float, ...]:
        """The reference's losses for `config`'s batch and clipping, run now where needed
        (`now`: also at another batch than the run's). () for a configuration that is its own
        reference, or when none could run."""
        if computes_reference(config):
            return ()
        key = self.key(config)
        if key in self.losses:
            return self.losses[key]
        cached = self.cache.losses(self.entry(config))
        if cached is not None:
            self.losses[key] = cached
            return cached
        if key[0] != self.run_batch and not now:
            # Most batch sizes tried never win, and an fp32 run of a large model at a doubled
            # batch costs as much as a compiled trial.
            return ()
        rungs = dict.fromkeys(self.canonical(rung) for rung in reference_configs(config))
        for reference in rungs:
            if not self.fits_device(reference):
                continue
            result = self.run(reference, f"the fp32 reference's losses at batch {key[0]}")
            if result.status == "ok" and result.losses:
                self.keep(reference, result)
                return tuple(result.losses[:LOSS_CHECK_STEPS])
            if result.status != "oom":
                # Only running out of memory is what a smaller rung mends; a crash or a hang
                # would cost each rung its timeout (a simulated hang at batch 64, stepping down
                # the halvings: 61-69 s a rung), and the budget's end stops the next one as well.
                break
        self.losses[key] = ()
        return ()

    def fp32_step_s(self, batch: int) -> float | None:
        """An fp32 eager step at `batch`, scaled from the slowest per sample of the runs that
        computed the reference (the baseline, a checkpointed reference)."""
        per_sample = self._trials().fp32_per_sample_s
        return per_sample * batch if per_sample else None

    def checked_elsewhere(self, config: TuneConfig) -> bool:
        """A trial of the same numerics (every option but the batch, micro-batch and
        checkpointing, which leave them alone) kept the reference's loss at another batch, and
        this one's gradients were checked at its own: the check is not run again. Where a trial
        lost the loss through its micro-batches alone, only a run that split too vouches for
        one that splits."""
        trials = self._trials()
        split = bool(config.micro_batch_size) and trials.split_lost
        return _config_numerics_key(config) in (trials.kept_split if split else trials.kept)

    def lost_unchecked(self) -> list[tuple[TrialResult, TrialResult]]:
        """(row, the trial that lost the loss for it) for every row that ran without its loss
        compared and has the values that change the numerics which lost the loss in another
        trial, unless the same numerics kept the loss at another batch (`checked_elsewhere`).
        The values blamed are those of the trial that lost which kept the loss in no trial of
        this search (a search of a held-out model lost it with float8 beside bf16 weights, then
        recommended float8 without them at another batch, where the reference run had crashed).
        Where every such value kept the loss elsewhere, their combination or the micro-batches
        are blamed: it counts against a row with all of those values that accumulates
        micro-batches where the failed trial did."""
        losses = self._trials().losses
        found = []
        for r in self.history.all():
            if r.status == "ok" and r.loss_ok is None and r.config \
                    and not computes_reference(r.tune_config):
                lost = _lost_by(r.tune_config, losses)
                if lost is not None and not self.checked_elsewhere(r.tune_config):
                    found.append((r, lost))
        return found

    def _check_at_run_batch(self, config: TuneConfig, result: TrialResult) -> TrialResult | None:
        """Where no reference could run at the best's batch (it ran out of memory, crashed): the
        same configuration is measured at the run's batch, where the reference's losses are
        known, in micro-batches no larger than its own. A loss lost there is lost here; one kept
        there is kept (`checked_elsewhere`). Without that check, a simulated search that had
        lost the loss with float8 tensorwise recommended float8 rowwise, never checked."""
        micro = config.micro_batch_size or config.batch_size or self.default_batch
        try:
            probe = config.replace(batch_size=self.run_batch,
                                   micro_batch_size=micro if micro < self.run_batch else 0)
        except Exception:  # (a combination the rules refuse: nothing is checked)
            return None
        if probe == config or not (self.losses.get(self.key(probe))
                                   or self.cache.losses(self.entry(probe))):
            return None
        checked = self.run(probe, f"its loss, checked at batch {self.run_batch}, where the fp32 "
                                  "reference ran", "trial")
        if checked.status in LOST_LOSS or checked.loss_ok is False:
            return lost_with(result, checked)
        return None

    def check_later(self, config: TuneConfig, result: TrialResult,
                    seconds_left: float, reference_s: Callable[[float | None], float]
                    ) -> TrialResult | None:
        """A trial that ran without the reference's losses (another batch) and is now the
        best: the reference runs at its batch and the trial's losses are checked against it, as
        its worker would have. Returns the row checked (a "loss-mismatch" where it left the
        tolerance), or None where nothing was checked."""
        if computes_reference(config) or result.loss_ok is not None or result.status != "ok":
            return None
        if self.history.best() is not result or self.checked_elsewhere(config):
            return None
        fp32_step = self.fp32_step_s(config.batch_size or self.default_batch)
        if reference_s(fp32_step) > seconds_left:
            self.unchecked_note = (
                f"the loss of {result.label} was not checked at batch {result.batch_size}: the "
                "fp32 reference there would not fit in the time left (its first-step gradients "
                "were checked)")
            return None
        reference = self.for_config(config, now=True)
        if not reference:
            return self._check_at_run_batch(config, result)
        tolerance = NUMERICS[numerics_class(dict(config.values))][0]
        ok, worst = check_losses(result.losses, reference, tolerance)
        if ok is None:
            return None
        checked = replace(result, loss_ok=ok, loss_max_rel_error=worst, loss_tolerance=tolerance)
        if not ok:
            checked = replace(checked, status="loss-mismatch", message=(
                f"loss differs from the fp32 reference by {worst:.2%} (tolerance "
                f"{tolerance:.1%}), checked after the run"))
        return checked


class _Trials:
    """What the checks read from a search's trials."""

    def __init__(self, rows: list[TrialResult]) -> None:
        rows = [r for r in rows if r.config]
        kept = [r for r in rows if r.loss_ok]
        self.kept = {_numerics_key(r.config) for r in kept}
        """The numerics (`_numerics_key`) that kept the reference's loss in a trial."""
        self.kept_split = {_numerics_key(r.config) for r in kept
                           if r.config.get("micro_batch_size")}
        """The same, of trials that accumulated micro-batches."""
        kept_values = {v for r in kept for v in numerics_values(r.tune_config)}
        self.losses = []
        """Each trial that lost the loss: (it, the values blamed, all its values that change
        the numerics, whether it accumulated micro-batches)."""
        for r in rows:
            if r.status in LOST_LOSS:
                theirs = frozenset(numerics_values(r.tune_config))
                self.losses.append((r, theirs - kept_values, theirs,
                                    bool(r.tune_config.micro_batch_size)))
        self.split_lost = any(split and not blamed for _, blamed, _, split in self.losses)
        """A trial lost the loss through its micro-batches alone."""
        per_sample = [r.step_ms / 1e3 / r.batch_size for r in rows
                      if r.status in ("ok", "stopped") and r.step_ms and r.batch_size
                      and computes_reference(r.tune_config)]
        self.fp32_per_sample_s = max(per_sample) if per_sample else None
        """The slowest fp32 eager step per sample of the runs that computed the reference."""


_SAME_NUMERICS = {"batch_size": 0, "micro_batch_size": 0, "checkpointing": "off",
                  "checkpoint_every": 2}
"""Options that leave what a configuration computes alone (but micro-batches, at times:
`References.checked_elsewhere`)."""


@functools.lru_cache(maxsize=100_000)
def _config_numerics_key(config: TuneConfig) -> tuple:
    """`_numerics_key` of a configuration (asked of every candidate of every decision)."""
    return _numerics_key(config.to_dict())


def _numerics_key(config: dict) -> tuple:
    """A configuration's values with those that leave its numerics alone set aside."""
    return tuple(sorted((key, tuple(v) if isinstance(v, list) else v)
                        for key, v in {**config, **_SAME_NUMERICS}.items()))


def _lost_by(config: TuneConfig, losses) -> TrialResult | None:
    mine = set(numerics_values(config))
    for r, blamed, theirs, split in losses:
        if blamed:
            if blamed <= mine:
                return r
        elif theirs <= mine and (config.micro_batch_size or not split):
            return r
    return None


def lost_with(result: TrialResult, lost: TrialResult) -> TrialResult:
    """`result`'s row as lost: its own loss was not checked, and `lost`, with the values of it
    that change the numerics, lost the reference's."""
    values = ", ".join(f"{key} {value}" for key, value in numerics_values(lost.tune_config))
    return replace(result, status="loss-mismatch", loss_ok=False, message=(
        f"its loss was not checked at batch {result.batch_size}, and {lost.label}, with "
        f"{f'the same values that change the numerics ({values})' if values else 'its numerics'}"
        f", lost the loss at batch {lost.batch_size}"))

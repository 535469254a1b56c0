"""Every measurement of this search at once: what a candidate is expected to give, from all the
runs so far, not only from its parent.

Throughput is modelled as the moves predict it (`priors.py`): the log of tokens/s is a level
(the model at one batch and micro-batch before any option) plus one effect for each option value
off its default, eager and compiled apart, each fused kernel apart, each drawn from its prior.
Values of one option share most of their doubt (bf16 and fp16 are both half precision; a value
eager and compiled), as the priors' moves between values assume. Given the runs, the effects
and the levels are normal, and so is a candidate's throughput (a Gaussian linear model). A lever
is then learned from any runs that differ in it, whatever else they differ in: the compiled
expert's recipe (float8, CUDA graphs, per block) beside the eager one and its float8 variant
tells what compiling alone does, which no single move measured. Each batch and micro-batch has
its level, known only from its own runs: a candidate at a batch where nothing ran is left to the
step-time physics and the batch priors (`prediction.py`). Torch-free."""

from __future__ import annotations

import functools
import math
from typing import Sequence

from strategies.config import TuneConfig
from strategies.registry import OPTIONS
from tuner_tui.engine.noise import is_noisy, spread
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.priors import UNKNOWN, Context, Estimate, speed_known, value_prior
from tuner_tui.engine.search.space import plain

OWN_SD = 0.03
"""What a value has of its own beyond the doubt its option's values share (as `move_prior`)."""
LEVEL_SD = 3.0
"""A level's doubt around its runs' own (log tokens/s): known from the runs alone."""
RUN_SD = 0.015
"""One run's own error (two of them make a measured pair's `SEARCH_SD`)."""
BATCH_KEYS = ("batch_size", "micro_batch_size")
"""Not effects: each batch and micro-batch has its own level."""

Feature = tuple[str, object, bool]
"""(option, or "kernel:<name>"; value; compiled)."""


@functools.lru_cache(maxsize=8192)
def features(config: TuneConfig, ctx: Context) -> dict[Feature, tuple[float, float]]:
    """The configuration's option values off their defaults, each with its prior (mean, sd)."""
    compiled = config.compile_mode != "off"
    found: dict[Feature, tuple[float, float]] = {}
    for key, option in OPTIONS.items():
        if key in BATCH_KEYS or option.search.lever == "training" or (
                key == "compile_scope" and not compiled):
            continue
        if key == "fused_kernels":
            for kernel in config.effective_kernels():
                found[(f"kernel:{kernel}", kernel, compiled)] = option.search.prior.get(
                    kernel, UNKNOWN).pick(ctx.device, compiled, ctx.large)
        elif plain(config[key]) != plain(option.default):
            value = plain(config[key])
            found[(key, value, compiled)] = value_prior(key, value, ctx, compiled)
    return found


def shape(config: TuneConfig, default_batch: int) -> tuple[int, int]:
    """The batch and the micro-batch a step runs."""
    batch = config.batch_size or default_batch
    return batch, config.micro_batch_size or batch


class _Fit:
    """The runs conditioned on once; a candidate is then a few vector products."""

    def __init__(self, runs: Sequence[TrialResult], ctx: Context) -> None:
        # (numpy when a search fits, not at import: the torch-free parts import with the
        # standard library alone, tests/test_packaging.py)
        import numpy as np

        self.ctx = ctx
        self._covs: dict[tuple, object] = {}
        self.shapes = [shape(r.tune_config, ctx.default_batch) for r in runs]
        rows = [features(r.tune_config, ctx) for r in runs]
        names: dict[Feature, tuple[float, float]] = {}
        for row in rows:
            names.update(row)
        self.names = list(names)
        index = {name: i for i, name in enumerate(self.names)}
        self.mean = np.array([names[n][0] for n in self.names])
        self.sd = np.array([names[n][1] for n in self.names])
        self.option = np.array([n[0] for n in self.names], dtype=object)
        self.value = np.array([repr(n[1]) for n in self.names], dtype=object)
        sigma = self._cov(self.option[:, None], self.value[:, None], self.sd[:, None])
        design = np.zeros((len(runs), len(self.names)))
        for i, row in enumerate(rows):
            design[i, [index[n] for n in row]] = 1.0
        self.design = design
        y = np.array([math.log(r.tokens_per_s) for r in runs])
        noise = [RUN_SD ** 2 + ((spread(r) or 0.0) ** 2 if is_noisy(r) else 0.0) for r in runs]
        # Each level's mean: its runs' own, less their effects' priors; its doubt wide.
        residual = y - design @ self.mean
        self.levels = {s: float(np.mean([x for x, t in zip(residual, self.shapes) if t == s]))
                       for s in set(self.shapes)}
        same = np.array([[a == b for b in self.shapes] for a in self.shapes], dtype=float)
        cov_runs = design @ sigma @ design.T + LEVEL_SD ** 2 * same + np.diag(noise)
        self.inverse = np.linalg.inv(cov_runs)
        self.alpha = self.inverse @ (residual - np.array([self.levels[s] for s in self.shapes]))

    def _cov(self, option, value, sd):
        """The prior covariance of the runs' effects with effects of (option, value, sd)."""
        import numpy as np

        return np.where(self.option == option, self.sd * sd
                        + OWN_SD ** 2 * (self.value == value), 0.0)

    def _cov_of(self, option, value, sd):
        """`_cov` of one effect, computed once per fit (the candidates share most effects)."""
        key = (option, repr(value), sd)
        found = self._covs.get(key)
        if found is None:
            found = self._covs[key] = self._cov(*key)
        return found

    def predict(self, child: TuneConfig) -> Estimate | None:
        import numpy as np

        want = shape(child, self.ctx.default_batch)
        if want not in self.levels:
            return None
        target = features(child, self.ctx)
        with_runs = np.zeros(len(self.names))
        var = LEVEL_SD ** 2
        for (option, value, _), (_, sd) in target.items():
            with_runs += self._cov_of(option, value, sd)
        for a, (_, sa) in target.items():
            for b, (_, sb) in target.items():
                if a[0] == b[0]:
                    var += sa * sb + (OWN_SD ** 2 if a[1] == b[1] else 0.0)
        cov_child = self.design @ with_runs + LEVEL_SD ** 2 * np.array(
            [s == want for s in self.shapes])
        guess = self.levels[want] + sum(m for m, _ in target.values()) + cov_child @ self.alpha
        var -= cov_child @ self.inverse @ cov_child
        return Estimate(float(guess), math.sqrt(max(float(var), 1e-6)))


class JointModel:
    """The joint prediction for one search, conditioned once per set of runs."""

    def __init__(self) -> None:
        self._fit: _Fit | None = None
        self._runs: list[TrialResult] = []
        self._ctx: Context | None = None

    def predict(self, child: TuneConfig, results: Sequence[TrialResult], ctx: Context
                ) -> Estimate | None:
        """The child's log tokens/s given the runs among `results` (None where none ran at
        its batch and micro-batch)."""
        runs = [r for r in results if speed_known(r) and r.loss_ok is not False]
        if ctx != self._ctx or len(runs) != len(self._runs) or any(
                a is not b for a, b in zip(runs, self._runs)):
            self._fit = _Fit(runs, ctx) if runs else None
            self._runs, self._ctx = runs, ctx
        return self._fit.predict(child) if self._fit is not None else None


def predict(child: TuneConfig, results: Sequence[TrialResult], ctx: Context) -> Estimate | None:
    """The same, conditioned afresh."""
    return JointModel().predict(child, results, ctx)

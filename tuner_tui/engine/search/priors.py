"""What a change of configuration is expected to do to throughput, before it is measured.

A move changes one option (or a few together) of a measured configuration. Its effect is a log
ratio of throughputs with a mean and a standard deviation: the shipped prior of each value
(`SearchFacts.prior` in the registry), sharpened by evidence, the measured pairs of trials that
differ by the same change, from this search and from this machine's result store (other
workloads count less, and less again for a model of another size class; a pair measured in
another context counts less the more options differ). So a lever measured once here is
predicted from that measurement the next time, and a second model on the same machine starts
from what the first taught. Failures (a compile error, a crash, lost numerics) lower the
chance that the values involved work again, the riskiest first. Torch-free.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from strategies.config import TuneConfig
from strategies.options import Prior
from strategies.registry import OPTIONS
from tuner_tui.engine.noise import is_noisy, spread
from tuner_tui.engine.protocol import TrialResult

LARGE_MODEL = 1e9
"""Parameters from which a model counts as large for the priors (`Prior.large`)."""
UNKNOWN = Prior((0.0, 0.02))
"""A value without a declared prior: expected to change nothing, with a little doubt (less than
any lever declared to matter, so that such options come after those)."""
TRAINING_SD = 0.005
"""An option that changes what is learned, not how fast (gradient clipping): a step takes the
same time whatever its value; the deviation is only what a measurement shows anyway."""
FAILED = ("compile", "crash", "diverged", "invalid", "numerics", "loss-mismatch")
"""Statuses that count against the change that led to them (out of memory is the memory
model's business)."""
NUMERICS_FAILED = ("diverged", "numerics", "loss-mismatch")
"""Failures blamed only on the values that change the numerics (precision, float8, bf16 weights
or optimizer state), where the configuration has any."""
SPLIT = ("micro_batch_size", "split")
"""Micro-batches accumulated, as a suspect: exact for most models, but another training where a
sample's loss depends on the others of its batch (BatchNorm, which the worker names before any
trial, or a loss averaged over a count that differs between micro-batches, which only a refused
trial shows)."""
SEARCH_SD = 0.02
"""The measurement's own uncertainty in a pair of this search (a few % of run-to-run noise)."""
CONTEXT_SD = 0.03
"""Added per option in which the pair's configuration differs from where the move is made."""
OTHER_WORKLOAD_SD = 0.05
OTHER_SIZE_SD = 0.10


@dataclass(frozen=True)
class Context:
    """What the priors depend on besides the move."""

    device: str
    """cuda or cpu."""
    large: bool = False
    """A model of LARGE_MODEL parameters or more."""
    default_batch: int = 1


@dataclass(frozen=True)
class Estimate:
    """A predicted log throughput ratio (or log throughput): normal, mean and deviation."""

    mean: float
    sd: float

    def plus(self, other: "Estimate") -> "Estimate":
        return Estimate(self.mean + other.mean, math.hypot(self.sd, other.sd))


@dataclass(frozen=True)
class Pair:
    """Evidence: the log ratio of `after` over `before`, which differ by a move of `key`."""

    key: str
    before: TuneConfig
    after: TuneConfig
    log_ratio: float
    extra_sd: float
    """Beyond the context's: another workload, another size class, a noisy measurement."""


def _batch(c: TuneConfig, ctx: Context) -> int:
    return c.batch_size or ctx.default_batch


def _micro(c: TuneConfig, ctx: Context) -> int:
    return c.micro_batch_size or max(1, _batch(c, ctx) // c.devices)


def value_prior(key: str, value, ctx: Context, compiled: bool) -> tuple[float, float]:
    """The prior of one value against its option's default (0, 0 for the default itself)."""
    option = OPTIONS[key]
    if _plain(value) == _plain(option.default):
        return 0.0, 0.0
    return option.search.prior.get(value, UNKNOWN).pick(ctx.device, compiled, ctx.large)


def _kernels_prior(kernels: Iterable[str], ctx: Context, compiled: bool) -> tuple[float, float]:
    facts = OPTIONS["fused_kernels"].search.prior
    mean = var = 0.0
    for k in kernels:
        m, s = facts.get(k, UNKNOWN).pick(ctx.device, compiled, ctx.large)
        mean, var = mean + m, var + s * s
    return mean, var


def move_prior(key: str, parent: TuneConfig, child: TuneConfig, ctx: Context) -> Estimate:
    """The shipped prior of moving `key` from parent's value to child's (what goes with it in
    the child, such as the AdamW made inert by bf16 weights, is part of the move)."""
    compiled = child.compile_mode != "off"
    if OPTIONS[key].search.lever == "training":
        return Estimate(0.0, TRAINING_SD)
    if key in ("batch_size", "micro_batch_size"):
        return batch_prior(parent, child, ctx)
    if key == "fused_kernels":
        before, after = set(parent.effective_kernels()), set(child.effective_kernels())
        m_add, v_add = _kernels_prior(after - before, ctx, compiled)
        m_rem, v_rem = _kernels_prior(before - after, ctx, compiled)
        return Estimate(m_add - m_rem, math.sqrt(v_add + v_rem + 1e-4))
    m_to, s_to = value_prior(key, _plain(child[key]), ctx, compiled)
    m_from, s_from = value_prior(key, _plain(parent[key]), ctx, parent.compile_mode != "off")
    # Values of one option share most of their doubt (bf16 and fp16 are both half precision):
    # between two values the deviation is what one has beyond the other.
    return Estimate(m_to - m_from, math.sqrt(abs(s_to ** 2 - s_from ** 2) + 0.03 ** 2))


def batch_doublings(parent: TuneConfig, child: TuneConfig, ctx: Context) -> tuple[float, float]:
    """(doublings of the micro-batch each forward and backward sees, doublings of the
    micro-batches accumulated per optimizer step) from parent to child."""
    shape = math.log2(_micro(child, ctx) / _micro(parent, ctx))
    return shape, math.log2(_batch(child, ctx) / _batch(parent, ctx)) - shape


def batch_prior(parent: TuneConfig, child: TuneConfig, ctx: Context) -> Estimate:
    """A change of the batch, the micro-batch or both, by what each forward sees and what is
    accumulated: a larger micro-batch takes the batch's prior per doubling (larger kernels), a
    smaller one the micro-batch's per halving; more micro-batches accumulated, the same kernels
    run more often, take their own (only the optimizer step is shared by more samples)."""
    compiled = child.compile_mode != "off"
    shape, accumulated = batch_doublings(parent, child, ctx)
    if shape >= 0:
        m, s = OPTIONS["batch_size"].search.prior["x2"].pick(ctx.device, compiled, ctx.large)
    else:
        m, s = OPTIONS["micro_batch_size"].search.prior["/2"].pick(ctx.device, compiled, ctx.large)
    am, asd = OPTIONS["batch_size"].search.prior["x2 accumulated"].pick(
        ctx.device, compiled, ctx.large)
    return Estimate(m * abs(shape) + am * accumulated, math.hypot(s * shape, asd * accumulated))


GRAD_ADD = 0.3
"""What each micro-batch past the first adds to a step, as a share of the optimizer step's
time: its gradients added into those held (two reads and a write of the gradients, against the
optimizer step's reads and writes of weights, gradients and state and clipping's of the
gradients: 12 of 40 bytes a parameter in fp32 with fp32 state, 6 of 20 in bf16)."""


def accumulation_move(step_s: float, optimizer_s: float, k_from: int, k_to: int) -> Estimate | None:
    """k_to micro-batches per optimizer step instead of k_from, the micro-batch kept, predicted
    from a measured step and its optimizer step: each micro-batch's forward and backward
    repeat, the optimizer step is shared by more samples. On the H200 a 1.5B llama with bf16
    weights, state and CUDA graphs ran 4 x 4 sequences 6.9% faster than 4 (its optimizer step
    about a tenth of the step); GPT-2 124M at 64 x 1024 tokens, whose step is far longer than
    its optimizer's, 0.2% slower for 2 x 64. None where the measurement leaves no forward and
    backward (a step all optimizer)."""
    add = GRAD_ADD * optimizer_s
    per_micro = (step_s - optimizer_s - add * (k_from - 1)) / k_from
    if per_micro <= 0 or k_from < 1 or k_to < 1:
        return None
    mean = math.log(k_to * step_s / (k_from * (k_to * per_micro + optimizer_s + add * (k_to - 1))))
    # Doubt: the gradients' addition is a share assumed, not measured, and the steps' noise.
    return Estimate(mean, 0.25 * abs(mean) + 0.005)


def move_of(before: TuneConfig, after: TuneConfig, canonical) -> str | None:
    """The one option whose change takes `before` to `after` (with what goes with it under
    `canonical`), or None where they differ by more than one move."""
    differing = before.differing(after)
    if not differing:
        return None
    if len(differing) == 1:
        return differing[0]
    for key in differing:
        try:
            if canonical(before.replace(**{key: after[key]})) == after:
                return key
        except Exception:  # a combination the rules refuse: not this key
            continue
    return None


def distance(a: TuneConfig, b: TuneConfig) -> int:
    return len(a.differing(b))


class Priors:
    """The expected effect of moves for one search: shipped priors, this search's measured pairs
    and the store's, and the failures seen."""

    def __init__(self, ctx: Context, canonical, store_pairs: Sequence[Pair] = ()) -> None:
        self.ctx = ctx
        self.canonical = canonical
        self.pairs: dict[str, list[Pair]] = defaultdict(list)
        for pair in store_pairs:
            self.pairs[pair.key].append(pair)
        self.stored = frozenset(pair.key for pair in store_pairs)
        """The options whose moves the store's pairs (earlier searches) taught."""
        self.failures: dict[tuple[str, object], float] = {}
        self.successes: dict[tuple[str, object], int] = {}

    # -- learning ------------------------------------------------------------------------------
    def observe(self, config: TuneConfig, result: TrialResult) -> None:
        """A trial ended: a failure is blamed on its risky values in proportion to their risk,
        a success clears each of them once more."""
        values = risky_values(config)
        if result.status in NUMERICS_FAILED and _splits(config) and not any(
                _changes_numerics(*v) and not self.successes.get(v) for v in values):
            # Every value here that changes the numerics has kept them elsewhere in this search:
            # the split into micro-batches changed the training.
            self.failures[SPLIT] = self.failures.get(SPLIT, 0.0) + 1.0
            return
        if result.status in NUMERICS_FAILED:  # a lost loss is the numerics' doing, not a kernel's
            values = [v for v in values if _changes_numerics(*v)] or values
        named = named_causes(config, result.message) if result.status in FAILED else {}
        if named:  # the message says which value failed: it alone is to blame
            for value, blame in named.items():
                self.failures[value] = self.failures.get(value, 0.0) + blame
            return
        if result.status in FAILED:
            # What it brought that has not worked here yet takes the blame: a value that has
            # worked keeps its chance whatever fails beside it, so blame put on it is lost.
            values = [v for v in values if not self.successes.get(v)] or values
        if result.status in FAILED and values:
            total = sum(risk_of(*v) for v in values)
            for key, value in values:
                blame = risk_of(key, value) / total
                self.failures[(key, value)] = self.failures.get((key, value), 0.0) + blame
                for sibling in _siblings(key, value):  # float8 rowwise fails where tensorwise did
                    self.failures[sibling] = self.failures.get(sibling, 0.0) + blame / 2
        elif result.status in ("ok", "stopped"):
            for value in values:
                if result.loss_ok is None and _changes_numerics(*value):
                    # It ran, but its loss was never compared (another batch than the
                    # reference's): that says nothing of the numerics it changes, and counted as
                    # kept they had cleared float8 of the losses it lost at the run's batch.
                    continue
                self.successes[value] = self.successes.get(value, 0) + 1

    def observe_check(self, config: TuneConfig, result: TrialResult) -> None:
        """A trial's loss checked after it ran (`observe` saw it unchecked): what it says of the
        values that change the numerics."""
        if result.loss_ok:
            for value in numerics_values(config):
                self.successes[value] = self.successes.get(value, 0) + 1
        elif result.status in NUMERICS_FAILED:
            self.observe(config, result)

    def add_pair(self, before: TuneConfig, b: TrialResult, after: TuneConfig, a: TrialResult,
                 extra_sd: float = 0.0) -> None:
        key = move_of(before, after, self.canonical)
        if key is None or not (a.tokens_per_s and b.tokens_per_s):
            return
        if is_noisy(a) or is_noisy(b):
            # A disturbed row (a GPT-2 trial at +-11% measured 17% under its two quiet runs of
            # other days) says as little about the move as its spread allows.
            extra_sd += math.hypot(spread(a) or 0.0, spread(b) or 0.0)
        self.pairs[key].append(Pair(key, before, after,
                                    math.log(a.tokens_per_s / b.tokens_per_s), extra_sd))

    def learn_from(self, measured: Sequence[tuple[TuneConfig, TrialResult]], new: TuneConfig,
                   result: TrialResult) -> None:
        """Every pair the new trial makes with those measured before it (single moves only)."""
        if not speed_known(result):
            return
        for config, other in measured:
            if config == new or not speed_known(other):
                continue
            if move_of(config, new, self.canonical) is not None:
                self.add_pair(config, other, new, result)

    # -- prediction ----------------------------------------------------------------------------
    def move(self, key: str, parent: TuneConfig, child: TuneConfig) -> Estimate:
        """The prior of the move sharpened by the measured pairs of the same change."""
        prior = move_prior(key, parent, child, self.ctx)
        if prior.sd <= 0:
            return prior  # it changes nothing its prior weighs (the same batch and micro-batch)
        precision = 1 / prior.sd ** 2
        weighted = prior.mean * precision
        batch = key in ("batch_size", "micro_batch_size")
        for pair in (self._batch_pairs() if batch else self.pairs.get(key, ())):
            ratio = self._scaled(pair, parent, child) if batch else _same_move(key, pair, parent,
                                                                               child)
            if ratio is None:
                continue
            sd = SEARCH_SD + CONTEXT_SD * distance(pair.before, parent) + pair.extra_sd
            if batch:
                # A doubling pays less the larger the micro-batch already is: a pair measured
                # far from this one says little about this doubling.
                sd += CONTEXT_SD * abs(math.log2(_micro(pair.before, self.ctx)
                                                 / _micro(parent, self.ctx)))
            weighted += ratio / sd ** 2
            precision += 1 / sd ** 2
        return Estimate(weighted / precision, math.sqrt(1 / precision))

    def _batch_pairs(self) -> list[Pair]:
        """Pairs of either batch option: `_scaled` takes those of the same kind of change."""
        return self.pairs.get("batch_size", []) + self.pairs.get("micro_batch_size", [])

    def _scaled(self, pair: Pair, parent: TuneConfig, child: TuneConfig) -> float | None:
        """A batch or micro-batch pair applied to this move, per doubling, where it is the same
        kind of change: the micro-batch grown, or shrunk, with any accumulation (what it
        measured is the kernels' size), or only more (or fewer) micro-batches accumulated."""
        measured = batch_doublings(pair.before, pair.after, self.ctx)
        wanted = batch_doublings(parent, child, self.ctx)
        if bool(measured[0]) != bool(wanted[0]):  # one changes the kernels' size, one does not
            return None
        at = 0 if wanted[0] else 1  # the shape's doublings where it changes, else accumulation's
        if measured[at] == 0 or wanted[at] == 0 or (measured[at] > 0) != (wanted[at] > 0):
            return None
        return pair.log_ratio / measured[at] * wanted[at]

    def chance_it_works(self, config: TuneConfig) -> float:
        """How likely the configuration runs and keeps the numerics: the product over its values
        that can fail of each one's chance. A value that has worked here is as good as its
        declared risk says (less with every success); one that has not takes each failure
        blamed on it as evidence that it fails here (failures on one machine and model repeat:
        a compile error comes back in every configuration that has the value)."""
        chance = FAILURE_EVIDENCE ** self.failures.get(SPLIT, 0.0) if _splits(config) else 1.0
        for value in risky_values(config):
            risk, ok = risk_of(*value), self.successes.get(value, 0)
            if ok:
                chance *= 1 - risk / (1 + ok)
            else:
                chance *= (1 - risk) * FAILURE_EVIDENCE ** self.failures.get(value, 0.0)
        return chance


def _same_move(key: str, pair: Pair, parent: TuneConfig, child: TuneConfig) -> float | None:
    """The pair's log ratio where it measured this move of `key` (or its reverse), else None."""
    got = _plain(pair.before[key]), _plain(pair.after[key])
    want = _plain(parent[key]), _plain(child[key])
    if got == want:
        return pair.log_ratio
    if got == want[::-1]:
        return -pair.log_ratio
    return None


FAILURE_EVIDENCE = 0.25
"""What one failure blamed wholly on a value leaves of its chance to work."""


def risk_of(key: str, value) -> float:
    prior = OPTIONS["fused_kernels"].search.prior.get(value) if key == "fused_kernels" else \
        OPTIONS[key].search.prior.get(value)
    return prior.risk if prior is not None else UNKNOWN.risk


def _splits(config: TuneConfig) -> bool:
    """Whether the configuration accumulates micro-batches (a canonical configuration's
    micro-batch is smaller than its batch wherever it is set)."""
    return bool(config.micro_batch_size)


def _changes_numerics(key: str, value) -> bool:
    return key != "fused_kernels" and value in OPTIONS[key].search.numerics


def named_causes(config: TuneConfig, message: str) -> dict[tuple[str, object], float]:
    """The values a failure's message names as its cause (`SearchFacts.fails_with`), with their
    blame: 1 for the configuration's own value, 1/2 for the others that share the cause."""
    text = (message or "").lower()
    found: dict[tuple[str, object], float] = {}
    for key, value in risky_values(config):
        if key == "fused_kernels":
            continue
        for words, values in OPTIONS[key].search.fails_with.items():
            if value in values and words in text:
                found[(key, value)] = 1.0
                for other in values:
                    if other != value:
                        found.setdefault((key, other), 0.5)
    return found


def _siblings(key: str, value) -> list[tuple[str, object]]:
    """The option's other values that are not its default (the kernels: none)."""
    if key == "fused_kernels":
        return []
    option = OPTIONS[key]
    return [(key, v) for v in option.search.values or getattr(option, "choices", ())
            if v != value and v != option.default]


def risky_values(config: TuneConfig) -> list[tuple[str, object]]:
    """The values of a configuration that could make it fail: every option not at its default
    (each fused kernel apart), but the batch and micro-batch sizes and clipping."""
    return list(_risky_values(config))


@lru_cache(maxsize=8192)  # (asked of the same configurations after every trial: per history row)
def _risky_values(config: TuneConfig) -> tuple[tuple[str, object], ...]:
    found = []
    for key, option in OPTIONS.items():
        if key in ("batch_size", "micro_batch_size", "grad_clip", "devices", "checkpoint_every"):
            continue
        if key == "fused_kernels":
            found += [(key, k) for k in config.effective_kernels()]
        elif _plain(config[key]) != _plain(option.default):
            found.append((key, _plain(config[key])))
    return tuple(found)


def numerics_values(config: TuneConfig) -> list[tuple[str, object]]:
    """The values of a configuration that change what it computes from the fp32 reference's
    (bf16, float8, bf16 weights, ...): where a lost loss is blamed."""
    return [v for v in _risky_values(config) if _changes_numerics(*v)]


def speed_known(r: TrialResult) -> bool:
    return r.status in ("ok", "stopped") and bool(r.tokens_per_s)


def _plain(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def store_pairs(rows: Iterable[tuple[str, TrialResult]], workload_key: str, large: bool,
                canonical, size_of) -> list[Pair]:
    """The measured pairs in this machine's store (`rows`: workload key and result), each
    weighed by where it comes from. `size_of(workload key)` says whether that workload's model
    is large (None: unknown)."""
    by_workload: dict[str, list[TrialResult]] = defaultdict(list)
    for key, result in rows:
        if speed_known(result):
            by_workload[key].append(result)
    pairs: list[Pair] = []
    for key, results in by_workload.items():
        extra = 0.0
        if key != workload_key:
            extra = OTHER_WORKLOAD_SD + (OTHER_SIZE_SD if size_of(key) not in (None, large) else 0.0)
        configs = []
        for r in results:
            try:
                configs.append((r.tune_config, r))
            except Exception:  # a row this version no longer reads
                continue
        for i, (a, ra) in enumerate(configs):
            for b, rb in configs[i + 1:]:
                if distance(a, b) > 3:
                    continue
                moved = move_of(a, b, canonical)
                if moved is not None:
                    pairs.append(Pair(moved, a, b, math.log(rb.tokens_per_s / ra.tokens_per_s),
                                      extra))
    return pairs

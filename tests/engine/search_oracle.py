"""A simulated machine and model for the search: a synthetic oracle of throughput, peak memory,
trial time and faults (`simulated_search.py` runs the real search on it, on a virtual clock).

An oracle draws a model (parameters from 100M to 3B, its width, heads, vocabulary, sequence
length, default batch), a memory budget (none, one around the lean configuration's peak, or one
in between), and the true effect of every option value: drawn around the registry's priors with
their deviations (so the priors are honest beliefs, not the truth), plus effects the priors do
not model: batch gains that shrink with each doubling, a micro-batch's cost per halving drawn
around the H200's measurements (the registry's prior), an optimizer step of the bytes it moves
on top of the forward and backward (shared by the micro-batches a step accumulates), CUDA
graphs that pay only on short steps, float8 that pays with the width, AdamW made inert by torchao's optimizers, and memory that
follows its own formula with an error of its own (fp32 SDPA with grouped heads keeping the
softmax weights, as on the H200). Recomputation (checkpointing) and optimizer
state offloaded to the host never make a step faster: their draws are capped at no gain (the
eager selective prior's wide doubt had drawn it +20-56% faster in 5% of oracles). Faults: a compile mode or float8 that fails
to compile on this machine, fp16 that diverges, float8 that loses the numerics, workers that die
or hang now and then, and measurements off by a disturbance.

A model has a number of distinct parameter shapes: few for most, 20-90 for one in four (a
network whose stages differ), each shape past ten adding a second to a compile and 1.25 to
torchao's step compile, as on an H100.

The optimum over the whole space is computed exactly, with numpy, over every combination of the
options (batch and micro-batch sizes included).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from strategies.config import TuneConfig
from strategies.registry import OPTIONS

GPU_BYTES = 141 * 10**9

AXES = {
    "precision": ("fp32", "tf32", "bf16", "fp16"),
    "weights": ("fp32", "bf16"),
    "attention": ("manual", "sdpa"),
    "fused_kernels": ((), ("layer_norm", "rms_norm", "swiglu", "gelu"),
                      ("layer_norm", "rms_norm", "linear_cross_entropy", "swiglu", "gelu")),
    "fp8": ("off", "tensorwise", "rowwise"),
    "checkpointing": ("off", "selective", "every-n", "full"),
    "compile_mode": ("off", "default", "reduce-overhead"),
    "compile_scope": ("model", "block"),
    "optimizer": ("plain", "foreach", "fused"),
    "optimizer_state": ("fp32", "bf16", "8bit", "offload"),
}
"""The options the oracle knows, and their values (the default space's on a GPU)."""
NEVER_FASTER = {"checkpointing", ("optimizer_state", "offload")}
"""What only adds work to a step (recomputation, host copies): its true effect is at most 0."""
MAX_DOUBLINGS = 4
"""The batch the oracle's optimum may reach: 16x the default."""


def _prior(key: str, value, large: bool, compiled: bool = False) -> tuple[float, float]:
    if value == OPTIONS[key].default or value == tuple(OPTIONS[key].default):
        return 0.0, 0.0
    found = OPTIONS[key].search.prior.get(value)
    return found.pick("cuda", compiled, large) if found is not None else (0.0, 0.02)


@dataclass
class Oracle:
    seed: int
    budget_kind: str = ""
    """none, tight, medium (drawn when empty)."""
    noise: float = 0.01
    fault_rate: float = 0.02
    """The chance a trial's worker dies or hangs."""
    inert_options: tuple[str, ...] = ()
    """Options whose values change nothing here (the test of irrelevant options)."""
    warm_share: tuple[float, float] = (0.1, 0.6)
    """A graph compiled before compiles again in this share of its first compile (drawn
    uniformly): 0.11-0.6 on the H200 (GPT-2, the 1.3B Llamas), once 1.1 (an HF Llama with float8,
    CUDA graphs and checkpointing)."""
    shared_truth: "Oracle | None" = None
    """Draw the levers' true effects as this oracle did (the same machine, another model)."""
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        r = self.rng
        # The model.
        self.params = float(math.exp(r.uniform(math.log(1e8), math.log(3e9))))
        self.hidden = int(min((768, 1024, 2048, 3072, 4096, 5120),
                              key=lambda h: abs(h - 0.45 * self.params ** 0.4)))
        self.layers = max(4, int(self.params / (12 * self.hidden ** 2)))
        self.heads = max(1, self.hidden // 128)
        self.kv_heads = int(r.choice([self.heads, max(1, self.heads // 4)]))
        self.intermediate = int(self.hidden * r.choice([4, 8 / 3]))
        self.vocab = int(r.choice([32000, 50304, 128256, 151936]))
        self.seq = int(r.choice([1024, 2048, 4096]))
        self.default_batch = max(1, int(2 ** round(math.log2(16384 / self.seq))))
        self.large = self.params >= 1e9
        self.base = math.log(4e13 / (6 * self.params + 12 * self.layers * self.hidden * self.seq))
        self.memory_error = float(r.uniform(0.92, 1.12))
        truth = self.shared_truth or self
        self.effects = truth._draw_effects(self.rng) if truth is self else truth.effects
        self.batch_gain = truth.batch_gain if truth is not self else float(abs(r.normal(0.07, 0.04)))
        self.ro_host_gain = truth.ro_host_gain if truth is not self else float(r.uniform(0.0, 0.06))
        self.fp8_width = truth.fp8_width if truth is not self else float(r.normal(0.06, 0.03))
        # (drawn apart, so that the oracles' other draws stay those of the seed)
        self.bandwidth = truth.bandwidth if truth is not self else float(
            np.random.default_rng([self.seed, 1]).uniform(2.0e12, 3.5e12))
        self.micro_halving = truth.micro_halving if truth is not self else \
            self._draw_micro_halving(np.random.default_rng([self.seed, 2]))
        self.ro_fails = bool(r.random() < 0.08)
        self.fp8_fails = bool(r.random() < 0.08)
        self.fp16_diverges = bool(r.random() < 0.15)
        self.fp8_numerics = bool(r.random() < 0.10)
        # Distinct parameter shapes (drawn apart): a transformer's repeated blocks have few (the
        # Llamas 6, GPT-2 9); one in four models has many, as networks whose stages differ do
        # (ResNet-50 28, EfficientNet-B0 69). Inductor builds kernels per shape, and torchao's
        # AdamW compiles its step per shape: on an H100 EfficientNet-B0 compiled whole in 76 s
        # (its size alone: 15 s) and torchao's step in 94 s.
        shapes_rng = np.random.default_rng([self.seed, 4])
        self.shapes = int(shapes_rng.integers(20, 91) if shapes_rng.random() < 0.25
                          else shapes_rng.integers(4, 11))
        self.compile_s = 15 + 30 * self.params / 1e9 + 1.0 * max(0, self.shapes - 10)
        kind = self.budget_kind or str(r.choice(["none", "tight", "medium", "medium"]))
        self.budget_kind = kind
        lean = self.lean_config()
        if kind == "none":
            self.budget = None
        elif kind == "tight":
            self.budget = int(self.peak(lean) * r.uniform(0.97, 1.25))
        else:
            self.budget = int(self.peak(lean) * r.uniform(1.3, 2.5))
        if self.budget is not None and self.budget > GPU_BYTES:
            self.budget = None
        self.reference_grads: set[str] = set()
        self.compiled: set[str] = set()
        """Configurations compiled before: the Inductor cache holds them (a repeat compiles in
        a fraction of the time)."""
        self.torchao_step_compiled = False
        """Whether a trial has compiled torchao's AdamW step (one graph per parameter shape):
        the first trial stepping with it pays that compile, later ones find it in the cache."""

    # -- the truth -----------------------------------------------------------------------------
    def _draw_effects(self, r) -> dict:
        """Each option's values share one draw of their doubt (bf16 and fp16 are both half
        precision; CUDA graphs are compile plus a little): effect = mean + sd x shared + a small
        value of its own, as the priors' moves between values assume."""
        effects = {}
        for key, values in AXES.items():
            if key == "fused_kernels":
                continue
            shared = r.normal()
            for value in values:
                own = r.normal() if value != OPTIONS[key].default else 0.0
                for compiled in (False, True):
                    m, s = _prior(key, value, self.large, compiled)
                    effect = m + s * shared + 0.02 * own
                    if (key, value) in NEVER_FASTER or key in NEVER_FASTER:
                        effect = min(effect, 0.0)
                    effects[(key, value, compiled)] = float(effect)
        for kernel in ("layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"):
            shared = r.normal()
            for compiled in (False, True):
                m, s = _prior_kernel(kernel, self.large, compiled)
                effects[("kernel", kernel, compiled)] = float(m + s * shared)
        return effects

    def _draw_micro_halving(self, r) -> dict[bool, float]:
        """What each halving of the micro-batch below the default batch costs, eager and
        compiled: drawn around the micro-batch's prior, sharing one doubt, never a gain."""
        prior = OPTIONS["micro_batch_size"].search.prior["/2"]
        shared = r.normal()
        drawn = {}
        for compiled in (False, True):
            mean, sd = prior.pick("cuda", compiled, self.large)
            drawn[compiled] = min(0.0, mean + sd * shared)
        return drawn

    def effect(self, key: str, value, compiled: bool) -> float:
        if key in self.inert_options:
            return 0.0
        return self.effects.get((key, value, compiled), 0.0)

    def lean_config(self) -> TuneConfig:
        return TuneConfig.from_dict({
            "precision": "bf16", "weights": "bf16", "optimizer_state": "bf16", "attention": "sdpa",
            "fused_kernels": list(AXES["fused_kernels"][2]), "compile_mode": "default"})

    def log_speed(self, c: TuneConfig) -> float:
        compiled = c.compile_mode != "off"
        total = self.base
        for key in ("precision", "weights", "attention", "checkpointing", "compile_mode",
                    "compile_scope", "optimizer_state"):
            if key == "compile_scope" and not compiled:
                continue
            total += self.effect(key, getattr(c, key), compiled)
        if c.weights == "fp32" and c.optimizer_state in ("fp32", "offload"):
            total += self.effect("optimizer", c.optimizer, compiled)
        if c.fp8 != "off":
            total += self.effect("fp8", c.fp8, compiled) + self.fp8_width * math.log2(
                self.hidden / 2048)
        kernels = c.effective_kernels()
        if "kernels_with_compile" in self.inert_options:  # which kernels run under compile
            kernels = c.replace(kernels_with_compile="inductor-first").effective_kernels()
        for kernel in kernels:
            total += self.effect("kernel", kernel, compiled) if "fused_kernels" not in \
                self.inert_options else 0.0
        batch = c.batch_size or self.default_batch
        micro = c.micro_batch_size or batch
        doublings = math.log2(micro / self.default_batch)
        if doublings >= 0:
            total += self.batch_gain * (1 - 0.35 ** doublings) / 0.65
        else:
            total += self.micro_halving[compiled] * -doublings
        if c.compile_mode == "reduce-overhead":
            step_ms = micro * self.seq / math.exp(total) * 1e3
            total += self.ro_host_gain * max(0.0, 1 - step_ms / 150)
        return float(self._accumulated(total, micro, batch // micro, c.weights,
                                       c.optimizer_state))

    def optimizer_s(self, weights, state):
        """The optimizer step's time: clipping's and AdamW's reads and writes of weights,
        gradients and state (6 x the weights' bytes and 2 x the state's a parameter: 40 bytes
        in fp32, 20 in bf16) at the machine's bandwidth; the offloaded state's host work is in
        its effect. Takes numpy arrays as well."""
        w = np.where(np.asarray(weights) == "bf16", 2, 4)
        state = np.select([np.asarray(state) == x for x in ("fp32", "bf16", "8bit")], [8, 4, 2], 0)
        return self.params * (6 * w + 2 * state) / self.bandwidth

    def _step_parts(self, log_speed_one, micro, weights, state):
        """(one micro-batch's forward and backward, the optimizer step, the addition of a
        micro-batch's gradients into those held: 3 x the weights' bytes a parameter), in
        seconds. The option's effects and the batch's curve give the forward and backward's
        throughput; the optimizer step comes on top of it, once a step."""
        one = micro * self.seq / np.exp(log_speed_one)
        opt = self.optimizer_s(weights, state)
        add = self.params * 3 * np.where(np.asarray(weights) == "bf16", 2, 4) / self.bandwidth
        return one, opt, add

    def _accumulated(self, log_speed_one, micro, k, weights, state):
        """The log speed of a step of k micro-batches, from the forward and backward's of one:
        each micro-batch's forward and backward repeat and add their gradients; the optimizer
        step runs once (more micro-batches always pay: the addition moves less than the step;
        and a smaller micro-batch never runs its forward and backward faster per sample)."""
        one, opt, add = self._step_parts(log_speed_one, micro, weights, state)
        return np.log(k * micro * self.seq / (k * one + opt + (k - 1) * add))

    def optimizer_ms(self, c: TuneConfig) -> float:
        """The optimizer step's time in a step of `c`, as the worker measures it."""
        return float(self.optimizer_s(c.weights, c.optimizer_state)) * 1e3

    def peak(self, c: TuneConfig) -> float:
        w = 2 if c.weights == "bf16" else 4
        state = {"fp32": 8, "bf16": 4, "8bit": 2, "offload": 0}[c.optimizer_state]
        static = self.params * (2 * w + state)
        b = 2 if c.precision in ("bf16", "fp16") or c.weights == "bf16" else 4
        h, i, kv = self.hidden, self.intermediate, self.hidden // self.heads * self.kv_heads
        kept = (5 * h + 2 * kv + 3 * i) if c.compile_mode != "off" else (7 * h + 3 * kv + 4 * i)
        layer = kept * b
        if c.fp8 != "off":
            layer -= (2 * h + i) * (b - 1)
        if c.attention == "manual":
            layer += 2 * self.heads * self.seq * b
        elif b == 4 and self.kv_heads < self.heads:
            # fp32 SDPA with grouped heads takes the math path, which keeps the softmax
            # weights (seen on the H200 with the HF Llama)
            layer += self.heads * self.seq * 4
        layers = self.layers * layer
        if c.checkpointing == "selective":
            layers = self.layers * min(layer, (5 * h + 2 * kv + 2 * i) * b)
        elif c.checkpointing == "every-n":
            layers = self.layers / 2 * layer + self.layers / 2 * h * b + layer
        elif c.checkpointing == "full":
            layers = self.layers * h * b + layer
        head = 0 if "linear_cross_entropy" in c.effective_kernels() else self.vocab * (b + 4)
        batch = c.batch_size or self.default_batch
        micro = c.micro_batch_size or batch
        activations = micro * self.seq * (layers + head)
        autocast = 2 * self.params if (c.weights == "fp32" and c.precision in ("bf16", "fp16")
                                       and c.checkpointing == "off") else 0
        # A whole-model graph returns every gradient at once beside those it adds them to; per
        # block, each block's are added as its backward ends (memory.held_beside: on an H100 the
        # HF Llama per block at micro-batch 2 held what its estimate without them says).
        grads_at_once = w * self.params if (micro < batch and c.compile_mode != "off"
                                            and c.compile_scope == "model") else 0
        # What counts against a budget: the allocator's reserved peak.
        return (static + activations + autocast + grads_at_once + 2**30) * self.memory_error * 1.05

    def fault(self, c: TuneConfig) -> tuple[str, str] | None:
        if c.compile_mode == "reduce-overhead" and self.ro_fails:
            return "compile", "compile failed: CUDA graphs capture failed (simulated)"
        if c.fp8 != "off" and self.fp8_fails:
            return "compile", "compile failed: float8 kernel (simulated)"
        if c.precision == "fp16" and self.fp16_diverges:
            return "diverged", "loss is nan (simulated)"
        return None

    def numerics_ok(self, c: TuneConfig) -> bool:
        return not (c.fp8 != "off" and self.fp8_numerics)

    def true_speed(self, c: TuneConfig) -> float | None:
        """Tokens/s where the configuration runs, fits and keeps the numerics; else None."""
        if self.fault(c) or not self.numerics_ok(c) or self.peak(c) > self.limit():
            return None
        return math.exp(self.log_speed(c))

    def limit(self) -> float:
        return min(self.budget or GPU_BYTES, GPU_BYTES)

    # -- the optimum ---------------------------------------------------------------------------
    def optimum(self, space) -> float:
        return self.best_config(space)[0]

    def best_config(self, space) -> tuple[float, "Cfg | None"]:
        """The best true tokens/s over the search's space, exactly, by enumerating every
        combination of the options' values at once (numpy): the AdamW implementation, which
        changes only speed, at its best; the largest batch the space
        reaches (MAX_DOUBLINGS doublings of the default: accumulation only adds speed); and the
        two largest micro-batches that fit (a larger one is faster but for the host's share
        that CUDA graphs save)."""
        grid = _grid(space)
        if grid is None:
            return 0.0, None
        names, idx = grid
        v = {k: np.asarray(AXES[k], dtype=object)[idx[k]] if k != "fused_kernels" else idx[k]
             for k in idx}
        compiled = v["compile_mode"] != "off"
        total = np.full(len(compiled), self.base)
        for key in ("precision", "weights", "attention", "checkpointing", "compile_mode",
                    "optimizer_state"):
            total += self._vector_effect(key, idx[key], compiled)
        values = space.values("optimizer")
        best = np.where(compiled, max(self.effect("optimizer", x, True) for x in values),
                        max(self.effect("optimizer", x, False) for x in values))
        steps_torch = (v["weights"] == "fp32") & np.isin(v["optimizer_state"], ["fp32", "offload"])
        total += np.where(steps_torch, best, 0.0)
        total += np.where(compiled, self._vector_effect("compile_scope", idx["compile_scope"],
                                                        compiled), 0.0)
        fp8 = v["fp8"] != "off"
        total += np.where(fp8, self._vector_effect("fp8", idx["fp8"], compiled)
                          + self.fp8_width * math.log2(self.hidden / 2048), 0.0)
        kernels = np.zeros(len(compiled))
        for i, kset in enumerate(AXES["fused_kernels"]):
            eager = sum(self.effect("kernel", k, False) for k in kset) \
                if "fused_kernels" not in self.inert_options else 0.0
            graph = sum(self.effect("kernel", k, True) for k in kset
                        if k not in ("layer_norm", "rms_norm", "gelu", "swiglu")) \
                if "fused_kernels" not in self.inert_options else 0.0
            kernels += np.where(v["fused_kernels"] == i, np.where(compiled, graph, eager), 0.0)
        total += kernels
        ok = ~((v["weights"] == "bf16") & (v["precision"] != "bf16"))
        ok &= ~((v["optimizer_state"] == "offload") & (v["precision"] == "fp16"))
        if self.ro_fails:
            ok &= v["compile_mode"] != "reduce-overhead"
        if self.fp8_fails or self.fp8_numerics:
            ok &= ~fp8
        if self.fp16_diverges:
            ok &= v["precision"] != "fp16"
        batch = (self.default_batch * 2**MAX_DOUBLINGS if "batch_size" in dict(space.choices)
                 else dict(space.fixed).get("batch_size") or self.default_batch)
        # Peak = fixed + micro x per sample (+ the gradients a graph returns at once, where
        # the micro-batch is less than the batch): solved for the largest micro that fits.
        fixed, per_sample, at_once = self._vector_peak_parts(v, compiled)
        scale = self.memory_error * 1.05
        room = self.limit() / scale - fixed
        fits_whole = room - batch * per_sample >= 0
        micro = np.where(fits_whole, batch,
                         np.floor(np.maximum(0, room - at_once) / per_sample))
        micro = np.where(micro >= 1, 2 ** np.floor(np.log2(np.maximum(micro, 1))), 0)
        micro = np.minimum(micro, batch)
        best, where = 0.0, None
        for m in (micro, micro / 2):
            usable = ok & (m >= 1)
            if not usable.any():
                continue
            m = np.maximum(m, 1)
            doublings = np.log2(m / self.default_batch)
            speed = total + np.where(doublings >= 0,
                                     self.batch_gain * (1 - 0.35 ** doublings) / 0.65,
                                     np.where(compiled, self.micro_halving[True],
                                              self.micro_halving[False]) * -doublings)
            step_ms = m * self.seq / np.exp(speed) * 1e3
            speed += np.where(v["compile_mode"] == "reduce-overhead",
                              self.ro_host_gain * np.maximum(0.0, 1 - step_ms / 150), 0.0)
            speed = self._accumulated(speed, m, batch // m, v["weights"], v["optimizer_state"])
            speed = np.where(usable, speed, -np.inf)
            i = int(np.argmax(speed))
            if np.exp(speed[i]) > best:
                best = float(np.exp(speed[i]))
                values = {k: (AXES[k][idx[k][i]]) for k in idx}
                values = {**DEFAULTS, **dict(space.fixed), **values}
                values["batch_size"], values["micro_batch_size"] = batch, int(m[i])
                where = Cfg(values)
                self._best_speed_only(where, space)
        return best, where

    def _vector_effect(self, key, index, compiled):
        eager = np.array([self.effect(key, x, False) for x in AXES[key]])
        graph = np.array([self.effect(key, x, True) for x in AXES[key]])
        return np.where(compiled, graph[index], eager[index])

    def _vector_peak_parts(self, v, compiled):
        """peak(micro) / (memory error x 1.05) = fixed + micro x per_sample (+ at_once where
        the micro-batch is less than the batch), as `peak` computes it."""
        w = np.where(v["weights"] == "bf16", 2, 4)
        state = np.select([v["optimizer_state"] == s for s in ("fp32", "bf16", "8bit")],
                          [8, 4, 2], 0)
        static = self.params * (2 * w + state)
        b = np.where(np.isin(v["precision"], ["bf16", "fp16"]) | (v["weights"] == "bf16"), 2, 4)
        h, i, kv = self.hidden, self.intermediate, self.hidden // self.heads * self.kv_heads
        kept = np.where(compiled, 5 * h + 2 * kv + 3 * i, 7 * h + 3 * kv + 4 * i)
        layer = kept * b
        layer = np.where(v["fp8"] != "off", layer - (2 * h + i) * (b - 1), layer)
        layer = np.where(v["attention"] == "manual", layer + 2 * self.heads * self.seq * b,
                         np.where((b == 4) & (self.kv_heads < self.heads),
                                  layer + self.heads * self.seq * 4, layer))
        ck = v["checkpointing"]
        layers = np.select(
            [ck == "selective", ck == "every-n", ck == "full"],
            [self.layers * np.minimum(layer, (5 * h + 2 * kv + 2 * i) * b),
             self.layers / 2 * layer + self.layers / 2 * h * b + layer,
             self.layers * h * b + layer],
            self.layers * layer)
        lce = (v["fused_kernels"] == 2)
        head = np.where(lce, 0, self.vocab * (b + 4))
        per_sample = self.seq * (layers + head)
        autocast = np.where((v["weights"] == "fp32") & np.isin(v["precision"], ["bf16", "fp16"])
                            & (ck == "off"), 2 * self.params, 0)
        at_once = np.where(compiled & (v["compile_scope"] == "model"), w * self.params, 0)
        return static + autocast + 2**30, per_sample, at_once

    def _best_speed_only(self, c: "Cfg", space) -> None:
        """The AdamW implementation at its fastest for `c`."""
        compiled = c.compile_mode != "off"
        values = space.values("optimizer")
        c.values["optimizer"] = max(values, key=lambda v: self.effect("optimizer", v, compiled))


def _grid(space):
    """Every combination of the oracle's options in the space (numpy index arrays), the AdamW
    implementation apart; None where the space holds an option's value
    the oracle does not know."""
    keys = [k for k in AXES if k != "optimizer"]
    choices = dict(space.choices)
    fixed = dict(space.fixed)
    lists = []
    for k in keys:
        values = choices.get(k) or (fixed.get(k, OPTIONS[k].default),)
        try:
            lists.append([AXES[k].index(tuple(x) if isinstance(x, list) else x) for x in values])
        except ValueError:
            return None
    mesh = np.array(list(itertools.product(*lists)), dtype=np.int64)
    return keys, {k: mesh[:, j] for j, k in enumerate(keys)}


DEFAULTS = {k: o.default for k, o in OPTIONS.items()}


class Cfg:
    """A configuration as the oracle reads it, without TuneConfig's validation (the optimum
    enumerates tens of thousands)."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def __getattr__(self, key):
        try:
            return self.__dict__["values"][key]
        except KeyError:
            raise AttributeError(key) from None

    def valid(self) -> bool:
        v = self.values
        return not ((v["weights"] == "bf16" and v["precision"] != "bf16")
                    or (v["optimizer_state"] == "offload" and v["precision"] == "fp16"))

    def effective_kernels(self) -> tuple:
        kernels = tuple(self.values["fused_kernels"])
        if self.values["compile_mode"] != "off":
            return tuple(k for k in kernels if k not in ("layer_norm", "rms_norm", "gelu", "swiglu",
                                                         "causal_softmax"))
        return kernels

    def label(self) -> str:
        return TuneConfig.from_dict({k: (list(v) if isinstance(v, tuple) else v)
                                     for k, v in self.values.items()}).label()


def _prior_kernel(kernel: str, large: bool, compiled: bool) -> tuple[float, float]:
    found = OPTIONS["fused_kernels"].search.prior.get(kernel)
    return found.pick("cuda", compiled, large) if found is not None else (0.0, 0.02)

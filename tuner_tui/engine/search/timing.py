"""How long a trial will take, before it runs: what the search divides a candidate's expected gain
by.

A trial is a worker's start and build, its first step (which holds torch.compile's work), the
warm-up and the measured steps, and, where no fp32 reference has run at its batch size yet, the
reference's own short run. Each part is learned from the trials of this search as they end
(medians, so one slow start or a cold cache does not set the rate), from the model's size before
any has. One-time costs (the C++ nodes' build, a cold Inductor cache) land in a single trial's
figures and do not move a median; torchao's step compile, paid by the first trial that steps
with it, is planned for that trial (`one_time_s`). A compile from the Inductor cache (of a graph
an earlier trial compiled: `graph_key`) is kept out of the cold compiles' medians and counted as
a share of its graph's first compile; the leaders' re-measure is planned with that share. A move
is ranked by a cold compile: ranked by the warm time, cheap moves of small gain (another AdamW,
more micro-batches accumulated) went first, and over 1000 simulated searches the answer at five
minutes was no better (+0.08% +- 0.05, paired). Whether it fits in the time left is judged by
the warm one (`trial_s(cached=True)`): near the end of a large model's search, where no cold
compile fits, the compiled answer's moves outside its graph still run in place of eager ones
that cannot beat it (2000 simulated searches at five minutes, paired: -0.06% +- 0.02 and, on
oracles not used to design it, -0.11% +- 0.03; a billion parameters and more -0.17% and -0.27%).
Torch-free.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Callable

from strategies.config import ConfigError, TuneConfig
from strategies.registry import OUTSIDE_GRAPH_KEYS
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import LOSS_CHECK_STEPS
from tuner_tui.engine.search.space import steps_with_torchao
from tuner_tui.engine.search.warming import StepWarming

START_S = {"cuda": 6.0, "cpu": 3.0}
"""A worker's start, build and teardown that the next worker's head start does not hide."""
WARM_COMPILE = 0.4
"""A graph compiled before compiles again from the Inductor cache in about this share of its
first compile, until this search has measured its own share. On the H200, GPT-2 124M (bf16,
SDPA, compile; benchmarks/results/h200-2026-12-03/graph-cache): 28.3 s cold, then 3.0-4.0 s
(0.11-0.14) for another AdamW, no clipping, batch 32 accumulated from micro-batches of 16, and
the first configuration again; batch 32 whole, a new shape, 23.3 s. The re-measures of the
1.3B Llamas with float8 and CUDA graphs (search-*, start and steps taken off their walls):
0.4 to 0.6. At 0.2, a re-measure planned to fit in 89 s took 147 s. The HF Llama with float8, CUDA
graphs and checkpointing every other block re-measured at about 1.1 (h200-2026-12-04/
search-hf16-cached-fit): a plan, not a promise; the re-measure is stopped at the budget's end
(`deadline.GRACE_S`)."""

TORCHAO_FIRST_S = {"cuda": 26.0, "cpu": 18.0}
"""torchao's AdamW (bf16 weights, bf16 or 8-bit state) compiles its step the first time it
steps, in the first such trial of a search; later workers read it from the Inductor cache. That
first trial's first step took 9-43 s on the H200 hosts (median 26 s, 33 searches) against 2-5 s
later; on 2 CPU cores gpt2-tiny's 18.2 s against 0.1 s for fp32 state (a fresh home). At least
this, for a model of few parameter shapes (the Llamas 6, GPT-2 9) ..."""
TORCHAO_PER_SHAPE_S = {"cuda": (0.0, 1.3), "cpu": (10.0, 1.0)}
"""... and for more, (base, seconds per distinct parameter shape): the step compiles once per
shape. On the GPU hosts ViT-B/16 (13 shapes) took 24 s, ResNet-50 (28) 28-43 s, and
EfficientNet-B0 (69 shapes, 76 with bf16 weights) 94 s (an H100, 2026-12-06; stopped as hung
after 68 s the search before, when this was planned at 12 s + 0.8 s a shape); on 2 CPU cores
4 shapes 16.9 s, gpt2-tiny's 8 18.2 s, 16 shapes 28.4 s."""


def graph_key(config: TuneConfig, default_batch: int = 0) -> str:
    """What torch.compile's graph depends on: the options inside it and the micro-batch it
    steps with (the batch where there is none); equal keys share the Inductor cache."""
    inside = {k: v for k, v in config.to_dict().items() if k not in OUTSIDE_GRAPH_KEYS}
    inside["micro-batch"] = config.micro_batch_size or config.batch_size or default_batch
    return json.dumps(inside, sort_keys=True, default=str)


MIN_MEASURED = 3
"""The fewest measured steps of a trial that accumulates many micro-batches a step."""


def stepping(config: TuneConfig, warmup_steps: int, steps: int, default_batch: int = 0,
             losses: int = LOSS_CHECK_STEPS) -> tuple[int, int]:
    """(warm-up, measured) optimizer steps of a trial planned as `warmup_steps` and `steps`:
    where `config` accumulates k micro-batches a step, a k-th of each, as many forwards and
    backwards as one micro-batch a step would run (a step of sixteen micro-batches of a 2B model
    takes seconds, and a steady one varies less), but at least two of warm-up, MIN_MEASURED
    measured, and `losses` in all: the losses its check compares (0 where its loss is checked
    at another batch, or not at all, as in a re-measure)."""
    batch = config.batch_size or default_batch
    try:
        k = config.accumulation_steps(batch) if batch else 1
    except ConfigError:  # (a batch the devices do not share: its trial says so)
        k = 1
    if k <= 1:
        return warmup_steps, steps
    warm = min(warmup_steps, max(2, -(-warmup_steps // k)))
    return warm, min(steps, max(-(-steps // k), losses - warm, MIN_MEASURED))


COMPILE_PER_SHAPE_S = 0.8
"""What each distinct parameter shape past COMPILE_SHAPES_FREE adds to a compile on the GPU:
Inductor builds kernels per shape, and a model of many (a convolutional network whose stages
differ) compiles far longer than its parameter count says. On an H100, EfficientNet-B0 (5.3M
parameters, 69 shapes) compiled whole in 76 s and ResNet-50 (25.6M, 28) in 36-53 s, where the
parameter count alone put them at 20-21 s; ViT-B/16 (86M, 13) took 23-24 s, GPT-2 (124M, 9)
26-33 s and the Llamas (6) what their size says. EfficientNet-B0's search planned its compiled
recipe at 35 s, ran an eager scout first, and was stopped at the budget's end 95 s into that
compile (2026-12-06)."""
COMPILE_SHAPES_FREE = 10


def compile_prior_s(device: str, params: int | None, config: TuneConfig,
                    shapes: int = 0) -> float:
    """torch.compile's first step before any was measured: about 20 s plus 40 s per billion
    parameters on an H200 host (GPT-2 124M 22-25 s, a 1.1B Llama 41-56 s, 74-84 s with float8),
    plus COMPILE_PER_SHAPE_S a distinct parameter shape (`shapes`, as a worker counted them)
    past COMPILE_SHAPES_FREE; per block a third of it; on the CPU about 25 s for a tiny
    model."""
    base = 20.0 + 40.0 * (params or 1e8) / 1e9 + COMPILE_PER_SHAPE_S * max(
        0, shapes - COMPILE_SHAPES_FREE) if device == "cuda" else 25.0
    if config.fp8 != "off":
        base *= 1.6
    if config.compile_scope == "block":
        base *= 0.4
    return base


@dataclass
class TrialTimes:
    device: str
    steps: int
    warmup_steps: int
    params: int | None = None
    default_batch: int = 0
    starts: list[float] = field(default_factory=list)
    compiles: dict[str, list[float]] = field(default_factory=dict)
    """Cold compiles per kind (scope, float8)."""
    graphs: dict[str, float] = field(default_factory=dict)
    """`graph_key` -> its first (cold) compile."""
    warm_shares: list[float] = field(default_factory=list)
    """Compiles from the cache, as shares of their graph's cold compile."""
    torchao_compiled: bool = False
    """Whether a trial of this search has stepped with torchao's AdamW (its step compiled)."""
    parameter_shapes: int = 0
    """The model's distinct parameter shapes, as a worker counted them (0: not yet)."""
    warming: StepWarming | None = None
    """torchao's steps compiled beside the trials, where they are (`warming.py`)."""
    now: Callable[[], float] | None = None
    """Seconds into the search, where `warming` is set."""

    def observe(self, config: TuneConfig, result: TrialResult, wall_s: float) -> None:
        """A trial ended after `wall_s` seconds: what its parts took."""
        first = result.compile_s or 0.0
        self.parameter_shapes = max(self.parameter_shapes, result.parameter_shapes)
        if steps_with_torchao(config) and result.compile_s is not None:
            self.torchao_compiled = True
        stepping = (result.warmup_s or 0.0) + result.measured_steps * (result.step_ms or 0.0) / 1e3
        if result.status in ("ok", "stopped") and wall_s > 0:
            self.starts.append(max(0.0, wall_s - first - stepping))
        if config.compile_mode != "off" and result.compile_s:
            graph = graph_key(config, self.default_batch)
            cold = self.graphs.get(graph)
            if cold is None:
                self.graphs[graph] = result.compile_s
                self.compiles.setdefault(self._compile_kind(config), []).append(result.compile_s)
            else:  # from the cache: kept apart, so it does not lower the cold compiles' median
                self.warm_shares.append(result.compile_s / cold)

    @staticmethod
    def _compile_kind(config: TuneConfig) -> str:
        return f"{config.compile_scope}{'+fp8' if config.fp8 != 'off' else ''}"

    def start_s(self) -> float:
        return statistics.median(self.starts) if self.starts else START_S.get(self.device, 6.0)

    def warm_share(self) -> float:
        return statistics.median(self.warm_shares) if self.warm_shares else WARM_COMPILE

    def warm_compile_s(self, config: TuneConfig, compile_s: float) -> float:
        """A compiled configuration whose first step took `compile_s`, run again: from the
        cache (a share of its graph's cold compile)."""
        return self.graphs.get(graph_key(config, self.default_batch), compile_s) * self.warm_share()

    def first_step_s(self, config: TuneConfig, step_s: float) -> float:
        if config.compile_mode == "off":
            return 0.5 + 3 * step_s
        same = self.compiles.get(self._compile_kind(config))
        if same:
            return statistics.median(same)
        if self.compiles:  # another kind measured: scale it as the prior scales the two
            other_kind, seen = next(iter(self.compiles.items()))
            other = next((c for c in _kinds(config) if self._compile_kind(c) == other_kind), None)
            if other is not None:
                ratio = compile_prior_s(self.device, self.params, config, self.parameter_shapes
                                        ) / compile_prior_s(self.device, self.params, other,
                                                            self.parameter_shapes)
                return statistics.median(seen) * ratio
        return compile_prior_s(self.device, self.params, config, self.parameter_shapes)

    def unmeasured_compile_doubt_s(self, config: TuneConfig) -> float:
        """How much longer than predicted a compile of a kind this search has not measured may
        take: its prediction scales the measured kind by the priors' ratio, which for per-block
        compile (0.4) held on the transformers measured (0.2-0.3 on the H200) and not on
        ResNet-50's stages (1.7, 86 s against 51 s: a trial predicted to fit ran 51 s past the
        budget; blocks of several shapes are now compiled whole, `strategies/compile.py`), and
        a user's blocks may differ in ways it cannot see. Up to the measured kind's own time."""
        if config.compile_mode == "off" or not self.compiles \
                or self.compiles.get(self._compile_kind(config)):
            return 0.0
        seen = max(statistics.median(times) for times in self.compiles.values())
        return max(0.0, seen - self.first_step_s(config, 0.0))

    def torchao_first_s(self) -> float:
        """torchao's step compile in the first trial that steps with it."""
        device = self.device if self.device in TORCHAO_FIRST_S else "cuda"
        base, per_shape = TORCHAO_PER_SHAPE_S[device]
        return max(TORCHAO_FIRST_S[device], base + per_shape * self.parameter_shapes)

    def one_time_s(self, config: TuneConfig, worst: bool = False) -> float:
        """What a trial of `config` would pay once for the whole search: torchao's step compile,
        in the first trial that steps with it; where the optimizer steps' worker compiles it
        beside the trials, what is left of that compile when the trial starts now (`worst`:
        all of it, until the worker has reported it: what a trial's timeout allows for)."""
        if not steps_with_torchao(config) or self.torchao_compiled:
            return 0.0
        full = self.torchao_first_s()
        warming, variant = self.warming, (config.weights, config.optimizer_state)
        if warming is None or self.now is None:
            return full
        if warming.is_compiled(variant):
            return 0.0
        ready = warming.ready_s(variant, full)
        if worst or ready is None:
            return full
        return min(full, max(0.0, ready - self.now()))

    def trial_s(self, config: TuneConfig, step_s: float | None, steps: int | None = None,
                cached: bool = False) -> float:
        """A trial of `config` whose steps are expected to take `step_s` each (`cached`: with
        its graph's compile from the Inductor cache where an earlier trial compiled it)."""
        step_s = step_s or 0.5
        warm, steps = stepping(config, self.warmup_steps, self.steps if steps is None else steps,
                               self.default_batch)
        first = self.first_step_s(config, step_s)
        if cached and config.compile_mode != "off" \
                and graph_key(config, self.default_batch) in self.graphs:
            first = min(first, self.warm_compile_s(config, first))
        first += self.one_time_s(config)
        return self.start_s() + first + (warm - 1 + steps) * step_s

    def reference_s(self, fp32_step_s: float | None) -> float:
        """The fp32 eager reference's short run at a new batch size (its losses), and its
        gradients computed by the next trial's worker."""
        step = fp32_step_s or 1.0
        return self.start_s() + (LOSS_CHECK_STEPS + 2) * step


def _kinds(config: TuneConfig) -> list[TuneConfig]:
    """The configuration under each compile kind (scope, with and without float8)."""
    found = []
    for scope in ("model", "block"):
        for fp8 in ("off", "tensorwise"):
            try:
                found.append(config.replace(compile_scope=scope, fp8=fp8))
            except Exception:
                continue
    return found

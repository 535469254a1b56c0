"""How long a trial will take, before it runs: what the search divides a candidate's expected
gain by.

A trial is a worker's start and build, its first step (which holds torch.compile's work), the
warm-up and the measured steps, and, where no fp32 reference has run at its batch size yet, the
reference's own short run. Each part is learned from the trials of this search as they end
(medians, so one slow start or a cold cache does not set the rate), from the model's size
before any has. One-time costs (the C++ nodes' build, a cold Inductor cache) land in a single
trial's figures and do not move a median. Torch-free.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from strategies.config import TuneConfig
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import LOSS_CHECK_STEPS

START_S = {"cuda": 6.0, "cpu": 3.0}
"""A worker's start, build and teardown that the next worker's head start does not hide."""


def compile_prior_s(device: str, params: int | None, config: TuneConfig) -> float:
    """torch.compile's first step before any was measured: about 20 s plus 40 s per billion
    parameters on an H200 host (GPT-2 124M 22-25 s, a 1.1B Llama 41-56 s, 74-84 s with float8);
    per block a third of it; on the CPU about 25 s for a tiny model."""
    base = 20.0 + 40.0 * (params or 1e8) / 1e9 if device == "cuda" else 25.0
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
    starts: list[float] = field(default_factory=list)
    compiles: dict[str, list[float]] = field(default_factory=dict)

    def observe(self, config: TuneConfig, result: TrialResult, wall_s: float) -> None:
        """A trial ended after `wall_s` seconds: what its parts took."""
        first = result.compile_s or 0.0
        stepping = (result.warmup_s or 0.0) + result.measured_steps * (result.step_ms or 0.0) / 1e3
        if result.status in ("ok", "stopped") and wall_s > 0:
            self.starts.append(max(0.0, wall_s - first - stepping))
        if config.compile_mode != "off" and result.compile_s:
            self.compiles.setdefault(self._compile_kind(config), []).append(result.compile_s)

    @staticmethod
    def _compile_kind(config: TuneConfig) -> str:
        return f"{config.compile_scope}{'+fp8' if config.fp8 != 'off' else ''}"

    def start_s(self) -> float:
        return statistics.median(self.starts) if self.starts else START_S.get(self.device, 6.0)

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
                ratio = compile_prior_s(self.device, self.params, config) / compile_prior_s(
                    self.device, self.params, other)
                return statistics.median(seen) * ratio
        return compile_prior_s(self.device, self.params, config)

    def trial_s(self, config: TuneConfig, step_s: float | None, steps: int | None = None) -> float:
        """A trial of `config` whose steps are expected to take `step_s` each."""
        step_s = step_s or 0.5
        steps = self.steps if steps is None else steps
        return (self.start_s() + self.first_step_s(config, step_s)
                + (self.warmup_steps - 1 + steps) * step_s)

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

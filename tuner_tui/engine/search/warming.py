"""torchao's AdamW steps compiled beside the trials, and when each is expected ready.

A trial that first steps with torchao's AdamW (bf16 weights; bf16 or 8-bit state) compiles its
step on its first step: 9-43 s on the GPU hosts, about a second and a third per parameter shape
past a few. A worker of its own compiles them for the space's (weights, optimizer_state) pairs
while the first trials run (`runner.OptimizerStepWarmup`); each lands in the Inductor cache the
trials share. The time model (`timing.TrialTimes.one_time_s`) then plans a trial of a pair
compiled by then without that cost, and one of a pair still compiling with what is left of it.
Torch-free.
"""

from __future__ import annotations

from strategies.config import ConfigError
from tuner_tui.engine.runner import pair_label as variant_label  # one name for a pair
from tuner_tui.engine.search.space import TORCHAO_STEPS, SearchSpace

WARM_START_S = 8.0
"""The optimizer steps' worker's start, before it compiles anything."""


def optimizer_step_variants(space: SearchSpace, budget_binds: bool) -> tuple[tuple[str, str], ...]:
    """The (weights, optimizer_state) pairs of `space` that torchao's AdamW steps, the likelier
    first: bf16 weights before fp32, and (bf16 weights, fp32 state), the eager scout's, first
    of all (in simulation the first pair a trial stepped with in 830 of 988 searches); then,
    under a memory budget of the user's, the smaller states (8-bit, bf16), else the larger.
    Ordered as a budget would have them throughout (8-bit state first), the simulated gain was
    lost (-0.01% +- 0.05 against -0.23% +- 0.06, seeds 0-999). Put in the order of the expert's
    recipes once the opening had made them (after the baseline, and after the reference where
    the baseline ran out of memory), the pairs moved too late to change an answer (2 of 1000).
    Offloaded state is left out: its step runs on the CPU."""
    states = ("fp32", "8bit", "bf16") if budget_binds else ("fp32", "bf16", "8bit")
    pairs = []
    for weights in ("bf16", "fp32"):
        for state in states:
            if weights not in space.values("weights") or state not in space.values(
                    "optimizer_state") or (weights == "fp32" and state not in TORCHAO_STEPS):
                continue
            try:
                space.canonical(space.start().replace(
                    precision="bf16" if "bf16" in space.values("precision") else "fp32",
                    weights=weights, optimizer_state=state))
            except ConfigError:  # (bf16 weights need bf16 autocast, which this machine lacks)
                continue
            pairs.append((weights, state))
    return tuple(pairs)


class StepWarming:
    """When each pair is expected compiled: one after another, each taking what the time model
    plans for torchao's first step, from the worker's start or from the last one reported."""

    def __init__(self, variants: tuple[tuple[str, str], ...], started_s: float) -> None:
        self.variants = variants
        self.since_s = started_s + WARM_START_S
        """When the compile of the first pair not yet reported began (expected)."""
        self.compiled: dict[tuple[str, str], float | None] = {}
        """Reported: seconds taken, or None where the compile failed."""
        self.notes: tuple[str, ...] = ()
        """What happened to the worker (`runner.OptimizerStepWarmup.what_happened`)."""

    def report(self, compiled: dict[tuple[str, str], float | None], now_s: float,
               notes: tuple[str, ...] = ()) -> None:
        """What the worker has compiled by `now_s`, and what went wrong with it."""
        self.notes = tuple(notes)
        if len(compiled) > len(self.compiled):
            self.compiled = dict(compiled)
            self.since_s = now_s

    def summary(self) -> str:
        """One line for the report: each pair compiled and in how long, or why not."""
        done = [f"{variant_label(v)} in {s:.0f} s" for v, s in self.compiled.items()
                if s is not None]
        failed = [variant_label(v) for v, s in self.compiled.items() if s is None]
        never = [variant_label(v) for v in self.variants if v not in self.compiled]
        parts = [f"compiled {', '.join(done)}" if done else "compiled none"]
        if failed:
            parts.append(f"failed: {', '.join(failed)}")
        if never:
            parts.append(f"not reached: {', '.join(never)}")
        line = "torchao's AdamW steps beside the trials: " + "; ".join(parts)
        return line + "".join(f"; {note}" for note in self.notes)

    def to_dict(self) -> dict[str, float | None]:
        """Each pair compiled: the seconds it took (None: it failed)."""
        return {variant_label(v): s for v, s in self.compiled.items()}

    def is_compiled(self, variant: tuple[str, str]) -> bool:
        return self.compiled.get(variant) is not None

    def ready_s(self, variant: tuple[str, str], each_s: float) -> float | None:
        """When `variant` is expected compiled, each pair taking `each_s`; None where it will
        not be (not among the pairs, or its compile failed)."""
        pending = [v for v in self.variants if v not in self.compiled]
        if variant not in pending:
            return None
        return self.since_s + (pending.index(variant) + 1) * each_s

"""The real search (driver, strategy, memory model, priors, re-measure, result store, reference
cache) run on a simulated machine (`search_oracle.py`): trials on the oracle through the
executor interface a worker pool serves, on a virtual clock; hundreds of searches in seconds,
with no torch and no worker. Also today's search before the anytime one, under the same
driver, for comparison."""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import numpy as np

from search_oracle import GPU_BYTES, Oracle
from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import protocol
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search.space import steps_with_torchao
from tuner_tui.engine.runner import NO_RESULT

GPU = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="Simulated H200",
                   fp8=True)


class Clock:
    """A virtual clock the simulated trials advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OracleExecutor:
    """The search's trials on the oracle: the result a worker would send, after the time it
    would take on the virtual clock."""

    def __init__(self, oracle: Oracle, clock: Clock, trial_log: list | None = None,
                 item_name: str = "tokens") -> None:
        self.o = oracle
        self.clock = clock
        self.item_name = item_name
        self.trials: list[TuneConfig] = [] if trial_log is None else trial_log
        self.warm_ready: dict[tuple[str, str], float] = {}
        self.native_asked = False
        """(weights, state) -> when the optimizer steps' worker has compiled it."""

    def start(self) -> protocol.WorkerReady:
        o = self.o
        self.clock.now += 8.0
        return protocol.WorkerReady(
            pid=1, capabilities=GPU.to_dict(),
            environment={"device": "cuda", "gpu_name": "Simulated H200", "gpu_count": 1,
                         "gpu_memory_bytes": GPU_BYTES, "torch": "sim", "code": "sim",
                         "gputune": "sim"},
            workload={"name": f"oracle-{o.seed}", "items_per_sample": o.seq,
                      "item_name": self.item_name,
                      "default_batch_size": o.default_batch, "seed": 0, "data": None})

    def warm_optimizer_steps(self, variants) -> None:
        """The optimizer steps' worker: up 8 s from now, then each pair's compile in turn,
        drawn as a trial's first torchao step is."""
        o = self.o
        ready = self.clock.now + 8.0
        for variant in variants:
            r = np.random.default_rng([o.seed, zlib.crc32(repr(variant).encode()), 5])
            ready += self._torchao_compile_s(r)
            self.warm_ready[variant] = ready

    def optimizer_steps_compiled(self) -> dict:
        return {v: 1.0 for v, t in self.warm_ready.items() if t <= self.clock.now}

    def optimizer_steps_notes(self) -> tuple[str, ...]:
        return ()

    def _torchao_compile_s(self, r) -> float:
        """torchao's step compile: the first such eager trial's first step took 9-43 s on the
        H200 hosts (median 26 s, 33 searches), later ones 2-5 s; once per shape, EfficientNet-B0's
        76 took 94 s on an H100."""
        seconds = float(r.uniform(10.0, 40.0))
        if self.o.shapes >= 20:
            seconds = max(seconds, 1.25 * self.o.shapes * float(r.uniform(0.8, 1.2)))
        return seconds

    def build_native(self) -> None:
        """The C++ nodes' build: the oracle charges no trial for it (asked is recorded)."""
        self.native_asked = True

    def native_build_summary(self) -> str | None:
        return None

    def close(self) -> None:
        pass

    def _shape(self) -> dict:
        o = self.o
        return {"layers": o.layers, "hidden": o.hidden, "intermediate": o.intermediate,
                "heads": o.heads, "kv_heads": o.kv_heads, "vocab": o.vocab, "seq_len": o.seq}

    def run(self, c: TuneConfig, plan, reference, progress, stop_ms, reference_dir) -> TrialResult:
        o = self.o
        # A trial's luck (faults, noise, compile time) is its own: the same configuration run
        # for the n-th time draws the same in every search of this oracle, so two versions of
        # the search compare on the same luck wherever they try the same things.
        nth = sum(1 for t in self.trials if t == c)
        r = np.random.default_rng([o.seed, zlib.crc32(c.label().encode()), nth])
        self.trials.append(c)
        batch = c.batch_size or o.default_batch
        base = TrialResult(config=c.to_dict(), label=c.label(), status="ok", batch_size=batch,
                           sequence_length=o.seq, model_shape=self._shape(),
                           item_name=self.item_name, parameter_shapes=o.shapes)
        seconds = 5.0
        if reference and reference_dir not in o.reference_grads:
            o.reference_grads.add(reference_dir)  # the worker computes the gradients' sketch once
            seconds += 3.0 + 2 * batch * o.seq / math.exp(o.base)
        if r.random() < o.fault_rate / 2:  # a worker killed from outside
            self.clock.now += seconds + 2.0
            return replace(base, status="crash", message="the worker process died (exit code -9)")
        if r.random() < o.fault_rate / 2:  # a hang: the trial's timeout ends it
            self.clock.now += plan.trial_timeout_s
            return replace(base, status="crash",
                           message=f"{NO_RESULT} {plan.trial_timeout_s:.0f} s; the worker was stopped")
        w = 2 if c.weights == "bf16" else 4
        state = {"fp32": 8, "bf16": 4, "8bit": 2, "offload": 0}[c.optimizer_state]
        parts = {"parameters": int(o.params * w), "gradients": int(o.params * w),
                 "optimizer_state": int(o.params * state)}
        peak = o.peak(c)
        if peak > GPU_BYTES:  # the worker counted the parameters before the first step
            self.clock.now += seconds + 3.0
            return replace(base, status="oom", message="out of memory (simulated)",
                           memory_parts={**parts, "gradients": 0, "optimizer_state": 0})
        fault = o.fault(c)
        compiled = c.compile_mode != "off"
        first = (o.compile_s * (1.6 if c.fp8 != "off" else 1) * (0.4 if c.compile_scope == "block"
                                                                    else 1) * r.uniform(0.8, 1.3)
                 if compiled else 1.0)
        if compiled:
            # The graph: what the model's forward and backward compute, at the micro-batch it
            # steps with; the optimizer, its state and clipping run outside it. A graph compiled
            # before comes from the Inductor cache, as on the H200 (GPT-2 0.11-0.14 of the cold
            # compile, the 1.3B Llamas with float8 and CUDA graphs 0.4-0.6).
            shape = c.micro_batch_size or c.batch_size or o.default_batch
            try:
                key = c.replace(optimizer="plain", optimizer_state="fp32", grad_clip=1.0,
                                batch_size=shape, micro_batch_size=0).label()
            except Exception:  # (a combination the rules refuse: its own graph then)
                key = c.label()
            first *= r.uniform(*o.warm_share) if key in o.compiled else 1.0
            o.compiled.add(key)
        if steps_with_torchao(c) and not o.torchao_step_compiled:
            # torchao's AdamW compiles its step in the first trial that steps with it (its own
            # draw: the trial's other draws stay as they were) ...
            step_compile = np.random.default_rng([o.seed, zlib.crc32(c.label().encode()), nth, 3])
            seconds_for_it = self._torchao_compile_s(step_compile)
            ready = self.warm_ready.get((c.weights, c.optimizer_state))
            if ready is not None:  # ... or reads what the optimizer steps' worker compiled
                seconds_for_it = min(seconds_for_it, max(0.0, ready - self.clock.now)) + 3.0
            first += seconds_for_it
            o.torchao_step_compiled = not fault  # (a failed compile never reached the step)
        if fault:
            self.clock.now += seconds + first
            return replace(base, status=fault[0], message=fault[1], memory_parts=parts)
        speed = math.exp(o.log_speed(c) + r.normal(0, o.noise))
        if r.random() < 0.03:
            speed *= 0.7  # a disturbed run: another process on the GPU
        step_ms = batch * o.seq / speed * 1e3
        spread = float(r.uniform(0.002, 0.01))
        steps = plan.steps
        status, message = "ok", ""
        if stop_ms is not None and step_ms > stop_ms:
            steps, status = 3, "stopped"
            message = f"stopped after 3 measured steps: median {step_ms:.1f} ms > {stop_ms:.1f} ms"
        wall = seconds + first + (plan.warmup_steps - 1 + steps) * step_ms / 1e3
        if wall > plan.trial_timeout_s:  # the driver stops a worker at its trial's timeout
            self.clock.now += plan.trial_timeout_s
            return replace(base, status="crash", message=f"{NO_RESULT} "
                           f"{plan.trial_timeout_s:.0f} s; the worker was stopped")
        self.clock.now += wall
        # Numerics that fail show in the losses too, for a check made after the run (at a batch
        # whose reference ran later) as for the worker's own.
        drift = 1.0 if o.numerics_ok(c) else 1.25
        losses = tuple((10.0 - 0.1 * i) * drift for i in range(plan.warmup_steps + steps))
        loss_ok = None
        if reference:
            loss_ok = o.numerics_ok(c)
            if not loss_ok:
                status, message = "loss-mismatch", "loss differs from the fp32 reference (simulated)"
        return replace(base, status=status, message=message, tokens_per_s=speed,
                       samples_per_s=speed / o.seq, step_ms=step_ms, step_ms_q1=step_ms * (1 - spread),
                       step_ms_q3=step_ms * (1 + spread), step_ms_min=step_ms * 0.98,
                       optimizer_ms=o.optimizer_ms(c) * float(r.uniform(0.95, 1.05)),
                       step_ms_max=step_ms * 1.05, peak_memory_bytes=int(peak / 1.05),
                       peak_reserved_bytes=int(peak), compile_s=first,
                       warmup_s=(plan.warmup_steps - 1) * step_ms / 1e3, measured_steps=steps,
                       losses=losses, loss_ok=loss_ok, memory_parts=parts,
                       loss_max_rel_error=0.001 if loss_ok else None,
                       loss_tolerance=0.03 if reference else None)


def simulate(oracle: Oracle, tmp_path, budget_s: float, strategy=None, choices=None, fixed=None,
             store_path=None, references=None, remeasure_repeats: int | None = None,
             out=None, item_name: str = "tokens"):
    """One search on the oracle; (outcome, executor, clock). `remeasure_repeats`: the plan's
    default (tune's) where None; `out`: where it prints (kept from sight where None);
    `item_name`: what the model's throughput counts."""
    import io

    from tuner_tui.engine.reference_cache import ReferenceCache
    from tuner_tui.engine.search import Search, SearchPlan
    from tuner_tui.engine.store import ResultStore

    clock = Clock()
    executor = OracleExecutor(oracle, clock, item_name=item_name)
    plan = SearchPlan(protocol.WorkerSpec(workload=f"oracle-{oracle.seed}", device="cuda"),
                      max_memory_bytes=oracle.budget, budget_s=budget_s, steps=20, warmup_steps=5,
                      choices=dict(choices or {}), fixed=dict(fixed or {}),
                      **({} if remeasure_repeats is None else
                         {"remeasure_repeats": remeasure_repeats}))
    store = ResultStore(store_path or tmp_path / f"store-{oracle.seed}.sqlite3",
                        on_problem=lambda message: None)
    refs = references or ReferenceCache(tmp_path / f"refs-{oracle.seed}")
    try:
        search = Search(plan, store, out=out or io.StringIO(), executor=executor, clock=clock,
                        references=refs, strategy=strategy)
        outcome = search.run()
    finally:
        store.close()
    return outcome, executor, clock


def regret(oracle: Oracle, outcome) -> float:
    """1 - the recommendation's true speed over the optimum's (1 where there is none or it does
    not truly fit)."""
    best = oracle.optimum(outcome.space)
    top = outcome.recommendation
    if top is None or not best:
        return 1.0
    speed = oracle.true_speed(top.tune_config)
    return 1.0 if speed is None else max(0.0, 1 - speed / best)


class LegacyStaged:
    """Today's search before the anytime one (tests/engine/legacy_staged.py), under the same
    driver: its stages' rounds in order until the time budget ends, each configuration the
    memory estimate says is clearly over the budget left out, as its driver did."""

    def __init__(self, search) -> None:
        from legacy_staged import History as LegacyHistory
        from legacy_staged import StagedSearch

        self.search = search
        self.space = search.space
        self.staged = StagedSearch(self.space)
        self.history = LegacyHistory(self.space, search.budget_bytes)
        self.queue: list = []
        self.ctx = None
        self.ended = ""  # (it does not say why it ends)

    def next(self, history):
        from tuner_tui.engine.search.proposal import Proposal
        from tuner_tui.engine.search.fit import Footprint

        for key, result in history.results.items():
            self.history.results[key] = result
        footprint = Footprint(history, self.space.default_batch, self.search.budget_bytes)
        while self.search.time_left() > 0:
            while self.queue:
                config = self.queue.pop(0)
                if config in history:
                    continue
                if (not self.staged.must_run(config) and footprint.estimate(config) is not None
                        and footprint.estimate(config).certain
                        and footprint.bytes(config) > 1.15 * self.search.budget_bytes):
                    self.history.add(config, TrialResult(config=config.to_dict(),
                                                         label=config.label(), status="skipped"))
                    continue
                return Proposal(config, f"stage: {self.staged.stage_name()}")
            self.queue = list(self.staged.propose(self.history))
            if not self.queue:
                return None
        return None

    def observe(self, *args) -> None:
        pass

    def observe_check(self, *args) -> None:
        pass

    def remaining(self, history) -> int:
        return 0

"""One configuration's training run and its measurement.

Measurement rules (../DESIGN.md): the same seeded initial weights and the same batches for every
configuration; the first step (which holds torch.compile's work) and the warm-up reported apart;
the median step time over a steady window; peak memory reset per configuration; the loss over
the first steps compared with the fp32 eager reference of the same seed.
"""

from __future__ import annotations

import ctypes
import gc
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import torch

import strategies
from strategies.config import ConfigError, TuneConfig
from strategies.registry import NUMERICS, OPTIONS, numerics_class
from tuner_tui.engine import resident_peak
from tuner_tui.engine.memory_parts import memory_parts
from tuner_tui.engine.model_shape import model_shape, parameter_shapes
from tuner_tui.engine.gradients import GradientCheck, compare
from tuner_tui.engine.mfu import Peak, peak_for
from tuner_tui.engine.noise import quartiles
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.reference import LOSS_CHECK_STEPS
from tuner_tui.engine.workloads import Workload

LOSS_TOLERANCE = {name: loss for name, (loss, _) in NUMERICS.items()}
"""Relative difference from the fp32 eager reference allowed over the first LOSS_CHECK_STEPS
losses, per numerics class (`strategies.registry.NUMERICS` says where the figures come from)."""
RANDOM_LOSS_FACTOR = 3.0
"""A model with its own randomness (dropout) is allowed this many times the loss spread its
reference measured (`reference_gradients.loss_spread`), where that is more than its class
allows: a run that draws other masks is off by about the spread at every step; over 8 steps its
worst reached 0.7-1.2x the spread (a held-out encoder with dropout 0.1, spread 0.50%, compiled
and micro-batched runs 0.37-0.58% off; an MLP with dropout 0.3, on the CPU)."""


def numerics(config: TuneConfig) -> str:
    """The numerics class whose tolerances the gate applies: the loosest among the
    configuration's options (fp8 where float8 matmuls run, bf16 for bf16 weights or state, else
    the precision)."""
    return numerics_class(dict(config.values))


HOST_AHEAD = 2


class Diverged(RuntimeError):
    pass



def classify(exc: BaseException) -> str:
    """Failure kind for an exception raised while building or training."""
    if getattr(exc, "failure_kind", None):  # a rank of a group already classified it
        return exc.failure_kind
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    if isinstance(exc, Diverged):
        return "diverged"
    if isinstance(exc, ConfigError):
        return "invalid"
    module = type(exc).__module__ or ""
    if module.startswith(("torch._dynamo", "torch._inductor", "triton")):
        return "compile"
    return "crash"


def describe_failure(exc: BaseException) -> str:
    kind = classify(exc)
    text = str(exc).strip()
    if getattr(exc, "failure_kind", None):
        return text
    if kind == "oom":
        # torch's message: "CUDA out of memory. Tried to allocate X GiB. GPU 0 has a total
        # capacity of ... of which Y is free. ..." Keep the two sentences that matter.
        parts = [p.strip() for p in text.split(". ") if p.strip()]
        keep = [p for p in parts if p.startswith(("Tried", "GPU", "Process"))][:2]
        detail = ". ".join(keep) if keep else text.splitlines()[0] if text else "out of memory"
        return (
            f"out of memory: {detail}. Try checkpointing (full or selective) or a smaller "
            "batch size."
        )
    if kind == "compile":
        lines = [ln for ln in text.splitlines() if ln.strip()]
        head = lines[0] if lines else type(exc).__name__
        where = next((ln.strip() for ln in lines if 'File "' in ln or "from user code" in ln), "")
        return f"compile failed: {type(exc).__name__}: {head}" + (f" ({where})" if where else "")
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if kind == "crash" else first


@dataclass
class StepRecord:
    step: int
    step_ms: float
    loss: float
    memory_allocated_bytes: int
    peak_memory_bytes: int
    rank_step_ms: tuple[float, ...] = ()
    """In a group: each rank's time for this step (step_ms is the slowest)."""
    optimizer_ms: float | None = None
    """The part of step_ms from the optimizer step on (clipping, the update, zeroing)."""


@dataclass
class Trainer:
    """Builds one configuration's run and steps it. Used by the worker for both the live run
    (one step at a time, between commands) and bench trials (a fixed number of steps)."""

    workload: Workload
    config: TuneConfig
    device: str
    seed: int = 0
    warmup_steps: int = 5
    reference_losses: tuple[float, ...] = ()
    device_name: str = ""
    rank: int = 0
    world_size: int = 1
    """In a group (parallel != none): this process's rank trains on its slice of each batch."""
    records: list[StepRecord] = field(default_factory=list)
    first_step_s: float | None = None
    report: dict = field(default_factory=dict)
    memory_parts: dict = field(default_factory=dict)
    """Bytes of parameters, gradients and optimizer state on the device, after the first step."""
    injected_delay_ms: float = 0.0
    """Test hook (WorkerSpec.fault_injection "noisy-steps:MS"): each step sleeps a random
    0..MS ms inside its timed part, as a busy neighbour would make it wait."""
    reference_gradients: dict | None = None
    """The fp32 reference's first-step gradients (reference_gradients.reference_gradients), on the CPU;
    None: the gradients go unchecked."""
    gradient_check: GradientCheck | None = None
    reference_loss_spread: float | None = None
    """How far the model's own randomness moves the reference's first loss (relative); None
    where it was not measured."""
    on_part: Callable[[int, str], None] | None = None
    """Called with (step, "forward" or "backward") as each micro-batch's part of a warm-up step
    is done: a trial far slower than planned shows that it works before its first step ends
    (`step_pace.py`). Not in the measured steps."""

    def __post_init__(self) -> None:
        self.torch_device = torch.device(self.device)
        self.batch_size = self.config.batch_size or self.workload.default_batch_size
        # Before anything is built: batch_size = 0 is the workload's default, known only here.
        self.accumulation_steps = self.config.accumulation_steps(self.batch_size)
        self._pending: list = []  # (step, end event (CUDA) or end time (CPU), loss copy, t_host,
        #                          the optimizer step's start, as the end)
        self._last_end = None
        self._last_host = None
        self._step = 0
        self._rss_base = psutil.Process().memory_info().rss
        self._rss_peak = self._rss_base
        self._high_water = False  # (whether `resident_peak` counts from this run's build)
        self._peak: Peak | None = None
        self._flops_per_step: float | None = None
        self._noise = random.Random(self.seed)

    # -- building ------------------------------------------------------------------------------
    def build(self) -> None:
        release_memory()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        else:
            warm_cpu_runtime(self.workload)
            # Measured from here, after the earlier runs of this process are freed and handed
            # back: a dashboard's worker then reports the peak a fresh bench process does.
            self._rss_base = self._rss_peak = trimmed_rss()
            self._high_water = resident_peak.reset()
        torch.manual_seed(self.seed)
        # Build on the device: initialisation of large models is slow on the CPU, and seeding
        # the device's generator keeps weights identical for every configuration.
        with self.torch_device:
            model = self.workload.build_model()
        model.train()
        optimizer = self.workload.make_optimizer(model)
        blocks = self.workload.blocks(model) if self.workload.blocks else None
        self.tuned = strategies.apply(
            self.config, model, optimizer, device_type=self.device, blocks=blocks
        )
        self.report = self.tuned.report
        # Counted before the first step as well: a trial that runs out of memory in it still
        # tells the parameter count, from which the next trial's peak is estimated.
        self.memory_parts = memory_parts(self.tuned.model, self.tuned.optimizer, self.torch_device)
        self._arm_gradient_check()

    def will_compile(self) -> bool:
        return self.config.compile_mode != "off"

    def first_step_builds(self) -> str:
        """What the first step builds once besides the step ("" for nothing): the dashboard
        shows "building ..." while it runs, not an eager run that measures nothing."""
        parts = []
        if self.will_compile():
            parts.append("torch.compile")
        optimizer = getattr(getattr(self, "tuned", None), "optimizer", None)
        if optimizer is not None and any(
            (c.__module__ or "").startswith("torchao") for c in type(optimizer).__mro__
        ):
            parts.append("torchao's compiled optimizer step")
        return " and ".join(parts)

    # -- stepping ------------------------------------------------------------------------------
    def step(self) -> list[StepRecord]:
        """Run one optimizer step. Returns the records that completed (after the warm-up the
        device runs up to HOST_AHEAD steps behind the host, so records arrive that much later)."""
        i = self._step
        batch = self._shard(self.workload.batch(i, self.batch_size, self.torch_device))
        host_start = time.perf_counter()
        if self.injected_delay_ms:
            time.sleep(self._noise.uniform(0.0, self.injected_delay_ms) / 1e3)
        losses = []
        tell = self.on_part if i < self.warmup_steps else None  # (none in the measured steps)
        for micro in self.tuned.micro_batches(batch):
            if self.config.compile_mode == "reduce-overhead":
                # Tell CUDA graph trees a new iteration starts, so the previous one's outputs
                # may be overwritten (we keep our own copy of each loss below).
                torch.compiler.cudagraph_mark_step_begin()
            with self.tuned.autocast():
                micro_loss = self.workload.loss(self.tuned.model, micro)
            if tell is not None:
                tell(i, "forward")
            losses.append(micro_loss.detach().clone() if self.accumulation_steps > 1 else micro_loss)
            self.tuned.backward(micro_loss)
            if tell is not None:
                tell(i, "backward")
        # Equal micro-batches: the batch's loss is the mean of theirs.
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        loss_value = self._copy_loss(loss)
        # The optimizer step is timed apart: more micro-batches per step share it (what the
        # search predicts an accumulated batch from).
        if self.device == "cuda":
            optimizer_start = torch.cuda.Event(enable_timing=True)
            optimizer_start.record()
        else:
            optimizer_start = time.perf_counter()
        self.tuned.step(zero_grad=i > 0)
        if i == 0:
            self.memory_parts = memory_parts(self.tuned.model, self.tuned.optimizer, self.torch_device)
            self.tuned.zero_grad()
        if self.device == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()  # the CPU ran the step synchronously: it ends here
        self._pending.append((i, end, loss_value, host_start, optimizer_start))
        self._step += 1
        # The first step (compile) and the warm-up are synchronous, so that their wall time is
        # exact; afterwards the host may run HOST_AHEAD steps ahead of the device. With one
        # step of slack, a compiled GPT-2 124M step measured 2.2 ms slower than a loop with no
        # synchronisation at all (host launch time is close to GPU time there); two absorb it.
        lag = 0 if i < self.warmup_steps else HOST_AHEAD
        return self._collect(keep=lag)

    def _shard(self, batch):
        """This rank's rows of the global batch: every rank draws the same batch as one process
        would and keeps its own slice, so the group trains on exactly that batch."""
        if self.world_size == 1:
            return batch
        rows = self.batch_size // self.world_size
        start = self.rank * rows

        def part(t):
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == self.batch_size:
                return t[start : start + rows]
            return t

        if isinstance(batch, dict):
            return {k: part(v) for k, v in batch.items()}
        parts = [part(t) for t in batch]
        return parts if isinstance(batch, list) else tuple(parts)

    def _copy_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A copy of the loss that can be read later without stalling the device.

        On CUDA the value goes to pinned host memory with a non-blocking copy, in stream order:
        it is ready once the step's end event has completed. Reading the device tensor instead
        (`.item()`) would wait for every step queued since, and leave the GPU idle while the
        host launches the next one. The copy also keeps the value safe from CUDA graph replays,
        which overwrite their output buffers on the next step."""
        if self.device != "cuda":
            return loss.detach().clone()
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        return host

    def restart_clock(self) -> None:
        """After a pause between steps (the pipeline drained, as after the warm-up): time the
        next step from now on the device, not from the last step's end, so the pause is not
        counted as step time."""
        self._collect(keep=0)
        if self.device == "cuda":
            now = torch.cuda.Event(enable_timing=True)
            now.record()
            self._last_end = now

    def finish(self) -> list[StepRecord]:
        return self._collect(keep=0)

    def peak_bytes(self) -> int:
        """The peak the step records report now (allocated on CUDA, resident growth on the CPU)."""
        if self.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        return self._rss_peak - self._rss_base

    def forget_peak(self) -> None:
        """Start the peak again from now, so that what a profile allocated (its event buffers)
        does not become the peak of the steps after it."""
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        else:
            self._rss_peak = max(self._rss_base, trimmed_rss())
            if self._high_water:
                resident_peak.reset()

    def _collect(self, keep: int) -> list[StepRecord]:
        done = []
        while len(self._pending) > keep:
            i, end, loss_t, host_start, optimizer_start = self._pending.pop(0)
            if not isinstance(end, float):
                end.synchronize()
                optimizer_ms = optimizer_start.elapsed_time(end)
                if self._last_end is not None and i > 0:
                    ms = self._last_end.elapsed_time(end)
                else:
                    ms = (time.perf_counter() - host_start) * 1e3
                self._last_end = end
            else:
                # Timed when the step ended, not now: collected HOST_AHEAD steps later, "now"
                # would add the steps since.
                ms = (end - host_start) * 1e3
                optimizer_ms = (end - optimizer_start) * 1e3
            loss = float(loss_t)
            if not math.isfinite(loss):
                raise Diverged(f"loss became {loss} at step {i}")
            if i == 0:
                self.first_step_s = ms / 1e3
            if self.device == "cuda":
                allocated = torch.cuda.memory_allocated()
                peak = torch.cuda.max_memory_allocated()
            else:
                rss = psutil.Process().memory_info().rss
                # (what the step allocated and freed within itself, where the system keeps it)
                high = resident_peak.high_water() if self._high_water else None
                self._rss_peak = max(self._rss_peak, rss, high or 0)
                allocated, peak = rss - self._rss_base, self._rss_peak - self._rss_base
            record = StepRecord(i, ms, loss, allocated, peak, optimizer_ms=optimizer_ms)
            self.records.append(record)
            done.append(record)
        return done

    # -- results -------------------------------------------------------------------------------
    def measured_records(self) -> list[StepRecord]:
        return [r for r in self.records if r.step >= self.warmup_steps]

    def peak(self) -> Peak:
        if self._peak is None:
            self._peak = peak_for(self.device, self.device_name, self.config.precision)
        return self._peak

    def mfu(self, step_ms: float) -> float | None:
        # On the CPU no peak is trustworthy (a probe of one matmul shape says little about
        # autocast or compiled kernels there), so MFU is only reported for GPUs.
        if self.workload.flops_per_item is None or self.device != "cuda":
            return None
        if self._flops_per_step is None:  # once: counting parameters every step costs host time
            self._flops_per_step = self.workload.flops_per_item(self.tuned.model) * self.items_per_step()
        flops = self._flops_per_step
        return flops / (step_ms / 1e3) / (self.peak().tflops * 1e12 * self.world_size)

    def items_per_step(self) -> int:
        return self.batch_size * self.workload.items_per_sample

    def loss_check(self) -> tuple[bool | None, float | None, float]:
        tolerance = max(LOSS_TOLERANCE[numerics(self.config)],
                        RANDOM_LOSS_FACTOR * (self.reference_loss_spread or 0.0))
        n = min(len(self.reference_losses), len(self.records), LOSS_CHECK_STEPS)
        if n == 0:
            return None, None, tolerance
        errors = [
            abs(self.records[i].loss - self.reference_losses[i]) / abs(self.reference_losses[i])
            for i in range(n)
        ]
        worst = max(errors)
        return worst <= tolerance, worst, tolerance

    def result(self, status: str = "ok", message: str = "") -> TrialResult:
        measured = self.measured_records()
        model = getattr(getattr(self, "tuned", None), "model", None)  # (None: not built)
        base = dict(
            config=self.config.to_dict(),
            label=self.config.label(skip=self.workload.inapplicable()),
            workload=self.workload.name,
            item_name=self.workload.item_name,
            device=self.device,
            batch_size=self.batch_size,
            sequence_length=self.workload.items_per_sample,
            losses=tuple(r.loss for r in self.records),
            compile_s=self.first_step_s,
            first_step_builds=self.first_step_builds(),
            strategy_report=self.report,
            memory_parts=self.memory_parts,
            model_shape=(model_shape(model, self.workload.items_per_sample)
                         if model is not None else {}),
            parameter_shapes=parameter_shapes(model) if model is not None else 0,
            message=message,
            **self._gradient_fields(),
        )
        if not measured or status != "ok":
            return TrialResult(status=status, **base)
        times = [r.step_ms for r in measured]
        median = statistics.median(times)
        q1, q3 = quartiles(times)
        ok, worst, tolerance = self.loss_check()
        if ok is False:
            status = "loss-mismatch"
            base["message"] = (
                f"loss differs from the fp32 reference by {worst:.2%} (tolerance "
                f"{tolerance:.1%} for {numerics(self.config)})"
            )
        status = self._gradient_verdict(status, base)
        if status in ("numerics", "loss-mismatch"):
            base["message"] += self._changed_training()
        warm = [r.step_ms for r in self.records if 0 < r.step < self.warmup_steps]
        peak = self.peak() if self.workload.flops_per_item and self.device == "cuda" else None
        return TrialResult(
            status=status,
            tokens_per_s=self.items_per_step() / (median / 1e3),
            samples_per_s=self.batch_size / (median / 1e3),
            step_ms=median,
            step_ms_min=min(times),
            step_ms_max=max(times),
            step_ms_q1=q1,
            step_ms_q3=q3,
            optimizer_ms=statistics.median(r.optimizer_ms for r in measured
                                           if r.optimizer_ms is not None)
            if any(r.optimizer_ms is not None for r in measured) else None,
            mfu=self.mfu(median),
            mfu_peak_tflops=peak.tflops if peak else None,
            mfu_peak_source=peak.source if peak else "not computed on the CPU",
            peak_memory_bytes=max(r.peak_memory_bytes for r in self.records),
            peak_reserved_bytes=(
                torch.cuda.max_memory_reserved() if self.device == "cuda" else None
            ),
            warmup_s=sum(warm) / 1e3 if warm else 0.0,
            measured_steps=len(measured),
            loss_ok=ok,
            loss_max_rel_error=worst,
            loss_tolerance=tolerance,
            **base,
        )

    # -- the gradient gate ---------------------------------------------------------------------
    def _arm_gradient_check(self) -> None:
        if self.reference_gradients is not None:
            self.tuned.after_backward = self._check_gradients

    def _check_gradients(self, model) -> None:
        """After the first backward pass only: later steps start from other weights."""
        self.tuned.after_backward = None
        check = compare(self.reference_gradients, model, numerics(self.config))
        if check.ok is False and self.tuned.scaler is not None and check.min_cosine != check.min_cosine:
            # fp16's loss scaler overflows on purpose at first and skips that step.
            check = GradientCheck(None, check.compared,
                                  message="unchecked: the loss scaler skipped the first step")
        self.gradient_check = check

    def _gradient_fields(self) -> dict:
        check = self.gradient_check
        if check is None:
            return {}
        return dict(grad_ok=check.ok, grad_worst_tensor=check.worst_tensor,
                    grad_min_cosine=check.min_cosine, grad_worst_norm_ratio=check.worst_norm_ratio)

    def _gradient_verdict(self, status: str, base: dict) -> str:
        """"numerics" when the first step's gradients left the tolerance (whatever the loss
        check said: the gradients name the tensor)."""
        check = self.gradient_check
        if check is None or check.ok is not False:
            return status
        base["message"] = check.message + (f"; {base['message']}" if base["message"] else "")
        return "numerics"

    def _changed_training(self) -> str:
        """The options of this configuration that train the model differently beyond rounding
        (`Workload.changes_training`), as the likely cause of a refusal ("" where none)."""
        found = self.workload.changes_training()
        causes = [f"{key}: {why}" for key, why in found.items()
                  if "=" not in key and self.config[key] != OPTIONS[key].default]
        return "".join(f"; {cause}" for cause in causes)

    def profile(self, steps: int, trace_path: str | None, measured_step_ms: float | None,
                compile_before: dict | None = None) -> dict:
        """The profile (`profiler.profile_trainer`) of `steps` more steps of this measured run."""
        from tuner_tui.engine.profiler import profile_trainer

        return profile_trainer(self, steps, trace_path, measured_step_ms, compile_before)

    def close(self) -> None:
        self._pending.clear()
        self.tuned = None
        release_memory()


_cpu_runtime_warm = False


def warm_cpu_runtime(workload: Workload) -> None:
    """Once per process, before the first run measured on the CPU: two steps of the workload
    at batch 1 with the default configuration, thrown away. A process's first steps also
    allocate the runtime's one-time state (thread pools, kernel and allocator caches: 13-28 MiB
    resident on the 2-core CI machine for gpt2-tiny), which stays for its later runs; warmed,
    the first configuration that a fresh bench process measures reports the peak that the
    dashboard's long-lived worker does for it, and no more than the configurations after it."""
    global _cpu_runtime_warm
    if _cpu_runtime_warm:
        return
    _cpu_runtime_warm = True
    trainer = Trainer(workload, TuneConfig.from_dict({"batch_size": 1}), "cpu", warmup_steps=0)
    try:
        trainer.build()
        trainer.step()
        trainer.step()
        trainer.finish()
    except Exception:  # noqa: BLE001 - the measured run that follows meets and reports it
        pass
    finally:
        trainer.close()


def trimmed_rss() -> int:
    """The process's resident memory once glibc has returned its free heap pages to the OS
    (it keeps freed memory cached, which would hide the next run's allocations)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the RSS as it is
        pass
    return psutil.Process().memory_info().rss


def release_memory() -> None:
    """Drop compiled graphs and cached blocks so the next configuration starts clean."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

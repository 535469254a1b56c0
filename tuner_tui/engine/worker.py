"""The worker process: owns the device, trains, and reports through events.

Started by `WorkerClient` (spawn context). It trains the live run one step at a time and looks
for commands between steps, so a new configuration, a pause or a shutdown is taken within a step.
Faults inside a configuration (OOM, divergence, a failed compile, any exception) become a
`RunFailed` event and the worker waits for the next command; only the death of the process
itself is left for the parent to notice.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import traceback

from strategies.config import ConfigError, TuneConfig
from tuner_tui.engine import noise, protocol, worker_log
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.reference import LOSS_CHECK_STEPS, reference_configs
from tuner_tui.engine.startup import Laps, StartupTimes
from tuner_tui.engine.workload_watch import within_limit


QUIET_WAIT_S = 120.0
"""Longest a trial waits, before its measured steps, for the parent's all-clear."""


class Worker:
    def __init__(self, spec: WorkerSpec, commands, events, quiet=None) -> None:
        self.spec, self.commands, self.events = spec, commands, events
        self.quiet = quiet
        """Set by the parent while no other gputune process is starting (see runner.NextWorker):
        measured steps begin only then."""
        # Re-parented (to init or a subreaper) means the parent is gone: exit then.
        self.parent_pid = os.getppid()
        self.trainer = None
        self.run_id = 0
        self.paused = False
        self.measure_steps = 20
        self.measure_cap = noise.adaptive_cap(20)
        """The live run reports after measure_steps, or while noisy, up to this many."""
        self.live_reported = False
        self.references: dict[tuple[int, float], tuple[float, ...]] = {}
        self.group = None
        """The rank processes of the current configuration if it has parallel != none
        (engine/group.py); kept while the next configuration has the same number of devices."""
        self.gradients: tuple[int, dict | None] | None = None
        """(batch size, the sketch of the fp32 reference's first-step
        gradients): the latest one."""
        self.loss_spread: float | None = None
        """How far the model's own randomness moves the reference's first loss, at that batch
        size (`reference_gradients.loss_spread`); None where unknown."""
        self.profile_request: protocol.ProfileRun | None = None
        """Taken on the live run once its measurement window is over."""
        self.compile_before: dict = {}
        """torch.compile's counters before the last build, so a profile counts its run's only."""

    def emit(self, event) -> None:
        self.events.put(event)

    # -- setup ---------------------------------------------------------------------------------
    def start(self) -> bool:
        startup = StartupTimes()
        from tuner_tui.engine import environment, workloads

        import torch

        startup.done("torch")
        try:
            self.device = environment.resolve_device(self.spec.device)
            if self.device == "cuda":
                if not torch.cuda.is_available():
                    raise ConfigError("device = cuda but torch sees no CUDA GPU: allowed devices are cuda, cpu")
            elif self.device != "cpu":
                raise ConfigError(f"unknown device {self.device!r}: allowed devices are cuda, cpu")
            name = workloads.resolve_name(self.spec.workload, self.device)
            self.workload = within_limit(f"workload {name!r}", lambda: workloads.load(
                name, self.spec.sequence_length, self.spec.seed, self.spec.data, self.device
            ), self.events)
            startup.done("workload")
            within_limit(f"the first batch of workload {name!r}", lambda: (
                workloads.check_first_batch(self.workload, name, self.device)), self.events)
            startup.done("first batch")
        except (ConfigError, workloads.WorkloadError, ValueError) as exc:
            self.emit(protocol.RunFailed(0, "invalid", str(exc)))
            return False
        except MemoryError:
            self.emit(protocol.RunFailed(0, "invalid", f"out of memory while loading workload "
                                         f"{self.spec.workload!r} (and its --data file, if any)"))
            return False
        worker_log.attach_library_loggers()  # the loggers torch and the workload made
        if (self.spec.fault_injection or "").startswith("grad:"):
            from tuner_tui.engine import faults

            faults.install(self.spec.fault_injection)
        self.caps = environment.capabilities(self.device)
        self.env = environment.fingerprint(self.device)
        startup.done("machine")
        described = self.describe_workload()
        startup.done("model facts")
        self.emit(
            protocol.WorkerReady(
                pid=os.getpid(),
                capabilities=self.caps.to_dict(),
                environment=self.env,
                workload=described,
                startup_s=startup.parts,
            )
        )
        return True

    def describe_workload(self) -> dict:
        """The workload's description, with what else makes its runs the same (store.workload_key)."""
        from pathlib import Path

        data = str(Path(self.spec.data).resolve()) if self.spec.data else None
        return {**self.workload.describe(), "seed": self.spec.seed, "data": data}

    # -- building a run ------------------------------------------------------------------------
    def injected_delay_ms(self) -> float:
        """The "noisy-steps:MS" test hook of WorkerSpec.fault_injection (0: none)."""
        fault = self.spec.fault_injection or ""
        if fault.startswith("noisy-steps:"):
            return float(fault.partition(":")[2])
        return 0.0

    def _trainer(self, config: TuneConfig, warmup: int, reference: tuple[float, ...]):
        from tuner_tui.engine.trial import Trainer

        if config.parallel != "none":
            from tuner_tui.engine.group import GroupTrainer

            return GroupTrainer(
                workload=self.workload, config=config, device=self.device, seed=self.spec.seed,
                warmup_steps=warmup, reference_losses=reference, device_name=self.caps.gpu_name,
                group=self.group,
            )
        return Trainer(
            workload=self.workload,
            config=config,
            device=self.device,
            seed=self.spec.seed,
            warmup_steps=warmup,
            reference_losses=reference,
            device_name=self.caps.gpu_name,
            injected_delay_ms=self.injected_delay_ms(),
            on_part=self._emit_part,
        )

    def _emit_part(self, step: int, part: str) -> None:
        """Tell the runner that a part of `step` is done: a sign of life (`protocol.StepPart`)."""
        self.emit(protocol.StepPart(self.run_id, step, part))

    def _fail(self, exc: BaseException, trainer=None) -> None:
        from tuner_tui.engine.trial import classify, describe_failure

        kind = classify(exc)
        message = describe_failure(exc)
        if kind == "crash" and not getattr(exc, "failure_kind", None):
            # A bug (ours or the user's): keep the traceback for the log, one line for the UI.
            # (A rank of a group prints its own.)
            traceback.print_exc()
        result = trainer.result(status=kind, message=message) if trainer else None
        self.emit(protocol.RunFailed(self.run_id, kind, message, result))

    def _new_run(self, config: TuneConfig, warmup: int, reference: tuple[float, ...]):
        """The trainer of run `self.run_id` (the caller numbered it), not built yet (the caller
        builds it, so that it can release what a failed build left); RunStarted sent."""
        config.check_runnable(self.caps)
        self._keep_group_for(config)
        trainer = self._trainer(config, warmup, reference)
        label = config.label(skip=self.workload.inapplicable())
        self.emit(protocol.RunStarted(self.run_id, config, label, trainer.batch_size,
                                      warmup_steps=warmup))
        return trainer

    def _keep_group_for(self, config: TuneConfig) -> None:
        """End a group that does not fit `config` (another size, or none needed, so that its
        GPUs are free) or that a fault ended; make the group `config` needs (started when the
        run is built, so that a failed start is this run's failure)."""
        size = config.devices if config.parallel != "none" else 0
        if self.group is not None and (self.group.world_size != size or not self.group.alive):
            self.group.shutdown()
            self.group = None
        if size and self.group is None:
            from tuner_tui.engine.group import RankGroup
            from tuner_tui.engine.trial import release_memory

            release_memory()  # what this process has cached on GPU 0 is rank 0's to use
            self.group = RankGroup(self.spec, self.device, size)

    def _build_trainer(self, trainer) -> None:
        if self._inject_oom(trainer.batch_size, trainer.config.precision):
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
                "0 bytes of which 0 bytes is free. (injected by WorkerSpec.fault_injection)"
            )
        from tuner_tui.engine.profiler import compile_counters

        builds = self._one_time_builds(trainer.config)
        if builds:  # the dashboard's "preparing" line says what the wait is for
            self.emit(protocol.WorkerLog("info", builds))
        self.compile_before = compile_counters()
        trainer.build()
        worker_log.attach_library_loggers()  # transformers and torchao make theirs on import

    def _one_time_builds(self, config: TuneConfig) -> str:
        """What building `config` does once per machine and may take a while, or "": the C++
        autograd nodes of the fused kernels are compiled on a CUDA machine's first use."""
        if self.device != "cuda" or not config.fused_kernels:
            return ""
        try:
            from gputune_kernels import _native
        except ImportError:
            return ""
        status = _native.status()
        if status in ("not built", "building"):
            return "building the fused kernels' C++ nodes (once per machine, then cached)"
        return ""

    def _inject_oom(self, batch_size: int, precision: str) -> bool:
        fault = self.spec.fault_injection or ""
        if fault.startswith("oom-above:"):
            _, limit, only = (fault.split(":") + [""])[:3]
            return batch_size > int(limit) and only in ("", precision)
        return fault == "oom"

    def _emit_records(self, trainer, records) -> None:
        for r in records:
            tokens_per_s = trainer.items_per_step() / (r.step_ms / 1e3) if r.step_ms > 0 else 0.0
            self.emit(
                protocol.StepMeasured(
                    run_id=self.run_id,
                    step=r.step,
                    step_ms=r.step_ms,
                    tokens_per_s=tokens_per_s,
                    loss=r.loss,
                    mfu=trainer.mfu(r.step_ms) if r.step > 0 else None,
                    memory_allocated_bytes=r.memory_allocated_bytes,
                    peak_memory_bytes=r.peak_memory_bytes,
                    wall_time=time.time(),
                    rank_step_ms=r.rank_step_ms,
                )
            )
            if r.step == 0 and trainer.first_step_builds():
                self.emit(protocol.CompileFinished(self.run_id, r.step_ms / 1e3))

    def _first_step(self, trainer) -> list:
        builds = trainer.first_step_builds()
        if builds:
            self.emit(protocol.CompileStarted(self.run_id, builds))
        return trainer.step()

    # -- the reference losses ------------------------------------------------------------------
    def reference(self, config: TuneConfig) -> tuple[float, ...]:
        """Losses of the fp32 eager configuration over the first steps, for this batch size and
        gradient clipping (both change the losses). Where plain fp32 runs out of memory, the
        same with full checkpointing, then in ever smaller micro-batches (`reference_configs`:
        each recomputes or accumulates, but computes the same losses); where none fits, () and
        the run's loss goes unchecked: a reference that does not fit must not stop a
        configuration that would."""
        from tuner_tui.engine.trial import classify

        batch_size = config.batch_size or self.workload.default_batch_size
        key = (batch_size, config.grad_clip)
        if key in self.references:
            return self.references[key]
        for reference in reference_configs(config.replace(batch_size=batch_size)):
            trainer = self._trainer(reference, warmup=LOSS_CHECK_STEPS, reference=())
            try:
                self._build_trainer(trainer)
                for _ in range(LOSS_CHECK_STEPS):
                    trainer.step()
                trainer.finish()
                self.references[key] = tuple(r.loss for r in trainer.records)
                return self.references[key]
            except Exception as exc:
                if classify(exc) != "oom":
                    raise
            finally:
                trainer.close()
        self.emit(protocol.WorkerLog(
            "warning", f"the fp32 reference at batch {batch_size} does not fit in memory, even "
            "with full checkpointing one sample at a time: the loss of this run goes unchecked"))
        return ()

    def reference_gradients(self, config: TuneConfig, cache_dir: str | None = None) -> dict | None:
        """The sketch of the fp32 reference's first-step gradients at this configuration's batch
        size (gradients.py): from the reference cache's entry `cache_dir` where a worker wrote it
        before, else computed here, before the candidate is built, and written there."""
        from tuner_tui.engine.reference_gradients import read_cached, reference_check, write_cached

        batch_size = config.batch_size or self.workload.default_batch_size
        key = batch_size  # clipping acts in the optimizer step, after the gradients compared
        if self.gradients is not None and self.gradients[0] == key:
            return self.gradients[1]
        self.gradients, self.loss_spread = None, None
        cached = read_cached(cache_dir) if cache_dir else None
        if cached is not None:
            sketched, self.loss_spread = cached
        else:
            found = reference_check(self.workload, batch_size, self.spec.seed, self.device,
                                    on_part=lambda part: self._emit_part(0, part))
            sketched, self.loss_spread = found if found is not None else (None, None)
            # (already a sketch, with each tensor's wobble)
            if sketched is None:
                self.emit(protocol.WorkerLog(
                    "warning", f"the fp32 reference's gradients at batch {batch_size} do not fit "
                    "in memory: the gradients of this run go unchecked"))
            elif cache_dir:
                try:
                    write_cached(cache_dir, sketched, self.loss_spread)
                except Exception as exc:  # the cache is a saving, never a failure
                    self.emit(protocol.WorkerLog(
                        "warning", f"the reference cache cannot be written: {exc}"))
        self.gradients = (key, sketched)
        return sketched

    # -- commands ------------------------------------------------------------------------------
    def run_trial(self, cmd: protocol.RunTrial) -> None:
        trainer = None
        self.run_id += 1
        try:
            self.stop_live()
            laps = Laps()  # where the trial's time goes, for its row (`phases_s`)
            gradients = self.reference_gradients(cmd.config, cmd.reference_dir)
            laps.done("reference gradients")
            trainer = self._new_run(cmd.config, cmd.warmup_steps, tuple(cmd.reference_losses))
            trainer.reference_gradients = gradients
            trainer.reference_loss_spread = self.loss_spread
            self._build_trainer(trainer)
            laps.done("build")
            self._emit_records(trainer, self._first_step(trainer))
            laps.done("first step")
            cap = noise.adaptive_cap(cmd.steps, cmd.max_steps)
            block = max(2, cmd.steps // 2)
            i = 1
            while True:
                launched = i - cmd.warmup_steps  # measured steps launched so far
                if launched >= cmd.steps and ((launched - cmd.steps) % block == 0 or launched >= cap):
                    # Planned steps done: more, a block at a time, while their spread is too
                    # wide to rank by (the pipeline is drained to judge all of them).
                    self._emit_records(trainer, trainer.finish())
                    if launched >= cap or self._settled(trainer):
                        break
                    trainer.restart_clock()
                if i == cmd.warmup_steps:
                    laps.done("warm-up")
                    self._wait_until_quiet(trainer)
                    laps.done("held")
                self._emit_records(trainer, trainer.step())
                i += 1
                if self._too_slow(trainer, cmd):
                    self._emit_records(trainer, trainer.finish())
                    laps.done("measured")
                    result = dataclasses.replace(self._stopped(trainer, cmd), phases_s=laps.parts)
                    self.emit(protocol.TrialFinished(self.run_id, result))
                    return
            self._emit_records(trainer, trainer.finish())
            laps.done("measured")
            result = trainer.result()
            if cmd.profile_steps and result.measured_steps:
                profile = self._profile(trainer, result, cmd.profile_steps, cmd.trace_path)
                laps.done("profile")
                result = dataclasses.replace(result, profile=profile)
            self.emit(protocol.TrialFinished(self.run_id,
                                             dataclasses.replace(result, phases_s=laps.parts)))
        except Exception as exc:
            self._fail(exc, trainer)
        finally:
            if trainer is not None:
                trainer.close()

    def _profile(self, trainer, result: protocol.TrialResult, steps: int,
                 trace_path: str | None) -> dict:
        """The profile of `steps` more steps of a measured run (see `profiler.py`); a profile
        that fails leaves the measured row as it is, with the reason."""
        from tuner_tui.engine.trial import describe_failure

        try:
            # (a group's ranks profile themselves: this process only drives them)
            alone = trainer.config.parallel == "none"
            before = trainer.peak_bytes() if alone else None
            profile = trainer.profile(steps, trace_path, result.step_ms, self.compile_before)
            if before is not None:
                # The profiler's event buffers are its own: reported apart, and the steps
                # after it measure their peak afresh.
                profile["profiler_memory_bytes"] = max(0, trainer.peak_bytes() - before)
                trainer.forget_peak()
            return profile
        except Exception as exc:
            message = f"profile failed: {describe_failure(exc) or type(exc).__name__}"
            self.emit(protocol.WorkerLog("warning", message))
            return {"error": message}

    def _wait_until_quiet(self, trainer) -> None:
        """Hold the measured steps while the parent starts the next trial's worker (importing
        torch and creating a CUDA context on the same machine would perturb them)."""
        if self.quiet is None or self.quiet.is_set():
            return
        self.quiet.wait(QUIET_WAIT_S)
        trainer.restart_clock()

    @staticmethod
    def _settled(trainer) -> bool:
        return noise.settled([r.step_ms for r in trainer.measured_records()])

    @staticmethod
    def _too_slow(trainer, cmd: protocol.RunTrial) -> bool:
        if cmd.stop_if_slower_than_ms is None:
            return False
        times = [r.step_ms for r in trainer.measured_records()]
        return noise.clearly_slower(times, cmd.stop_if_slower_than_ms, cmd.stop_reference_spread,
                                    max(1, cmd.stop_after_steps))

    @staticmethod
    def _stopped(trainer, cmd: protocol.RunTrial) -> protocol.TrialResult:
        # Keep the figures of the steps measured so far; the status keeps it out of the ranking.
        result = trainer.result()
        gap = noise.tie_gap(noise.spread(result) or 0.0, cmd.stop_reference_spread)
        return dataclasses.replace(
            result,
            status="stopped" if result.status == "ok" else result.status,
            message=result.message or (
                f"stopped after {result.measured_steps} measured steps, clearly slower than the "
                f"best: even its faster quarter of steps ({result.step_ms_q1:.1f} ms) is slower "
                f"than the stop line {cmd.stop_if_slower_than_ms:.1f} ms (the best's throughput "
                f"at this batch, less the early stop's margin) by more than the combined spread "
                f"(±{gap:.1%})"
            ),
        )

    def apply_config(self, cmd: protocol.ApplyConfig) -> None:
        self.stop_live()
        trainer = None
        # Numbered first: a failure from here on (the fp32 reference included) belongs to this
        # request, never to the run it replaces, whose measured row must stay as it was.
        self.run_id += 1
        try:
            reference = self.reference(cmd.config)
            gradients = self.reference_gradients(cmd.config)
            trainer = self._new_run(cmd.config, 5, reference)
            trainer.reference_gradients = gradients
            trainer.reference_loss_spread = self.loss_spread
            self._build_trainer(trainer)
            self.measure_steps = cmd.measure_steps
            self.measure_cap = noise.adaptive_cap(cmd.measure_steps, cmd.max_steps)
            self.live_reported = False
            self.trainer = trainer
            self._emit_records(trainer, self._first_step(trainer))
            return
        except Exception as exc:
            self._fail(exc, trainer)
        # Released only here, after the except clause: until it ends, the exception's traceback
        # holds the failed step's frames and every tensor in them (after an OOM, nearly all of
        # the GPU), so emptying the allocator's cache inside it would free nothing.
        self.trainer = None
        if trainer is not None:
            trainer.close()

    def live_step(self) -> None:
        trainer = self.trainer
        try:
            self._emit_records(trainer, trainer.step())
            done = len(trainer.measured_records())
            # After measure_steps, and while their spread is too wide to rank by, up to the cap.
            if not self.live_reported and done >= self.measure_steps and (
                done >= self.measure_cap or self._settled(trainer)
            ):
                self.live_reported = True
                self.emit(protocol.TrialFinished(self.run_id, trainer.result()))
            if self.live_reported and self.profile_request is not None:
                request, self.profile_request = self.profile_request, None
                profile = self._profile(trainer, trainer.result(), request.steps, request.trace_path)
                self.emit(protocol.ProfileMeasured(self.run_id, profile))
        except Exception as exc:
            self._fail(exc, trainer)
        else:
            return
        self.stop_live()  # after the except clause, as in apply_config

    def stop_live(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None

    def compile_optimizer_steps(self, variants) -> None:
        """torchao's steps compiled ahead of the trials (`engine/optimizer_steps.py`), behind
        them: this worker does nothing else, and the trials' measurements run beside it."""
        from tuner_tui.engine import optimizer_steps

        optimizer_steps.lowest_priority()  # every thread; its compile pool inherits it
        optimizer_steps.compile_all(
            self.workload, self.device, variants,
            lambda weights, state, seconds, error: self.emit(protocol.OptimizerStepsCompiled(
                weights, state, round(seconds, 3), error)))

    def handle(self, cmd) -> bool:
        """Returns False when the worker should exit."""
        if isinstance(cmd, protocol.Shutdown):
            return False
        if isinstance(cmd, protocol.ApplyConfig):
            self.paused = False
            self.apply_config(cmd)
        elif isinstance(cmd, protocol.RunTrial):
            self.run_trial(cmd)
        elif isinstance(cmd, protocol.ProfileRun):
            self.profile_request = cmd
            if self.trainer is None:
                self.emit(protocol.WorkerLog(
                    "warning", "no run is training: the profile waits for the next run"))
        elif isinstance(cmd, protocol.CompileOptimizerSteps):
            self.compile_optimizer_steps(cmd.variants)
        elif isinstance(cmd, protocol.Pause):
            self.paused = True
            if self.trainer is not None:
                self._emit_records(self.trainer, self.trainer.finish())
            self.emit(protocol.Paused())
        elif isinstance(cmd, protocol.Resume):
            self.paused = False
            self.emit(protocol.Resumed())
        return True

    def loop(self) -> None:
        while True:
            training = self.trainer is not None and not self.paused
            try:
                cmd = self.commands.get_nowait() if training else self.commands.get(timeout=0.5)
            except queue.Empty:
                cmd = None
            if cmd is not None and not self.handle(cmd):
                break
            if cmd is None and training:
                self.live_step()
            if os.getppid() != self.parent_pid:  # the parent died without a Shutdown
                break
        self.stop_live()
        if self.group is not None:
            self.group.shutdown()


def _exit_with_parent(parent_pid: int) -> None:
    """End this process once its parent is gone. The command loop looks at the parent only
    between commands; a long trial, compile or group step would otherwise keep running (and keep
    the GPUs busy) after the parent was killed. A group's ranks die with this process."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="gputune-parent-watch", daemon=True).start()


def run_worker(spec: WorkerSpec, commands, events, quiet=None) -> None:
    # First, before torch and the libraries print anything: into the run's log, not the
    # terminal (worker_log.py).
    worker_log.capture_output(
        spec.log_path,
        lambda level, text, source: events.put(protocol.WorkerLog(level, text, source)),
    )
    worker = Worker(spec, commands, events, quiet)
    _exit_with_parent(worker.parent_pid)
    if worker.start():
        worker.loop()
    # Let the queue's feeder thread flush the last events before the process exits.
    events.close()
    events.join_thread()

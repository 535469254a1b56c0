"""A worker group: the processes that train a configuration with parallel != none.

How it is started. The worker process (spawned by the torch-free parent: dashboard, bench,
tune) stays what it is, the one process that speaks the protocol, and becomes the group's
launcher: it spawns `devices` rank processes (engine/rank.py) with torchrun's environment
(env:// rendezvous on a free local port; NCCL on GPUs, gloo on the CPU; NVLink multicast off).
It never joins the process group itself, so tearing a group down is ending its processes, and
the worker's own CUDA context, reference runs and state stay as they were.

How it runs. `GroupTrainer` is a `Trainer` whose build and steps happen in the ranks: each
command goes to every rank, and the worker waits for every answer, so the ranks run in lock
step while each rank's host still runs ahead of its device as a single trainer does. A group
step's figures are the group's: the slowest rank's step time, the mean of the ranks' losses
(each over its equal slice of the global batch: the loss of that batch), the largest rank's
memory; each rank's own figures travel beside them. batch_size is the global batch, what the
optimizer sees: devices x the per-rank batch.

Faults. A rank that raises (out of memory, divergence, a failed compile) answers with its
failure; a rank that dies is seen at once through its process sentinel; a rank that stops
answering after the warm-up is declared hung after HANG_S seconds (or HANG_STEPS step times,
for slow steps). In each case the group is killed at once (every rank and what it started),
and the run fails with a message that names the rank and the reason. The worker starts a new
group for the next configuration. A group is kept between configurations of the same size and
ended when the size changes or a configuration needs none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import time
from dataclasses import dataclass, field, replace
from multiprocessing import current_process, get_context
from multiprocessing.connection import wait
from typing import Any

import psutil

from strategies.config import ConfigError
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.rank import GROUP_ENVIRON, RankSpec, rank_entry
from tuner_tui.engine.trial import StepRecord, Trainer

START_TIMEOUT_S = 300.0
"""Starting the ranks: importing torch, joining the process group, building the workload."""
SLOW_TIMEOUT_S = 1800.0
"""Building a run, and its warm-up steps (which compile): a hang there is noticed this late,
a dead rank at once."""
HANG_S = 10.0
HANG_STEPS = 10
CLOSE_TIMEOUT_S = 120.0
DEATH_GRACE_S = 0.5
"""After a rank's error, how long to look for a dead rank that caused it."""


class RankFailed(RuntimeError):
    """A rank failed; the group is gone. `failure_kind` is the protocol's failure kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.failure_kind = kind


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class RankGroup:
    """The rank processes of one group and the queues to them."""

    def __init__(self, spec: WorkerSpec, device: str, world_size: int) -> None:
        self.spec, self.device, self.world_size = spec, device, world_size
        self.processes: list = []
        self.seq = 0
        self.alive = False

    # -- starting and ending -------------------------------------------------------------------
    def start(self) -> None:
        if self.device == "cuda":
            import torch

            count = torch.cuda.device_count()
            if self.world_size > count:
                raise ConfigError(
                    f"devices = {self.world_size} but this machine has {count} GPU(s): "
                    f"allowed devices are 1 to {count}"
                )
        os.environ.update(GROUP_ENVIRON)  # inherited by every process the ranks start
        # The worker is a daemonic process (so that it ends with its parent), and
        # multiprocessing refuses children to those; the ranks end with the worker (daemonic
        # themselves, and killed by the kernel when it dies: rank.py), so none is left behind.
        current_process().daemon = False
        ctx = get_context("spawn")
        port = free_port()
        self.replies = ctx.Queue()
        self.commands, self.probes = [], []
        for rank in range(self.world_size):
            commands = ctx.Queue()
            probe, child_probe = ctx.Pipe()
            process = ctx.Process(
                target=rank_entry,
                args=(RankSpec(self.spec, self.device, rank, self.world_size, port), os.getpid(),
                      commands, self.replies, child_probe),
                name=f"gputune-rank{rank}", daemon=True,
            )
            process.start()
            self.processes.append(process)
            self.commands.append(commands)
            self.probes.append(probe)
        self.alive = True
        self._collect(0, START_TIMEOUT_S, "start")

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def kill(self) -> None:
        """End every rank and everything it started, now."""
        self.alive = False
        victims = []
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(process.pid)
                victims.extend(parent.children(recursive=True))
                victims.append(parent)
        for victim in victims:
            with contextlib.suppress(psutil.Error):
                victim.kill()
        psutil.wait_procs(victims, timeout=5.0)
        for process in self.processes:
            process.join(1.0)
        self._close_queues()

    def shutdown(self, timeout: float = 3.0) -> None:
        """Ask the ranks to leave the process group and exit; kill those that do not (within
        the 5 s that WorkerClient.stop gives the worker itself)."""
        if self.alive:
            for commands in self.commands:
                with contextlib.suppress(Exception):
                    commands.put((0, "exit", ()))
            deadline = time.monotonic() + timeout
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def _close_queues(self) -> None:
        for q in [getattr(self, "replies", None), *getattr(self, "commands", [])]:
            if q is not None:
                q.close()
                q.cancel_join_thread()

    # -- commands ------------------------------------------------------------------------------
    def call(self, op: str, *args: Any, timeout: float, what: str = "") -> list:
        """Send one command to every rank; their answers, by rank. Raises RankFailed (the group
        killed) if a rank fails, dies or does not answer within `timeout` seconds. `what` names
        the command in those messages (e.g. "step 12")."""
        if not self.alive:
            raise RankFailed("crash", "the worker group is not running")
        self.seq += 1
        for commands in self.commands:
            commands.put((self.seq, op, args))
        return self._collect(self.seq, timeout, what or op)

    def _collect(self, seq: int, timeout: float, op: str) -> list:
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while len(answers) < self.world_size:
            while True:
                try:
                    got_seq, rank, status, payload = self.replies.get_nowait()
                except Exception:  # queue.Empty, or a half-written message still arriving
                    break
                if got_seq != seq:
                    continue
                if status == "error":
                    # A rank that died makes its peers' collectives fail too: name the dead one.
                    wait(list(sentinels), timeout=DEATH_GRACE_S)
                    died = self._died(answers, op)
                    self.kill()
                    kind, message = payload
                    raise died or RankFailed(kind, f"rank {rank}: {message}")
                answers[rank] = payload
            if len(answers) == self.world_size:
                break
            died = self._died(answers, op)
            if died:
                self.kill()
                raise died
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._hung(op, [r for r in range(self.world_size) if r not in answers],
                                 timeout)
            wait([self.replies._reader, *sentinels], timeout=min(remaining, 0.5))
        return [answers[r] for r in range(self.world_size)]

    def _died(self, answers: dict, op: str) -> RankFailed | None:
        # The sentinel is set as the process exits, a moment before waitpid reports it.
        exited = set(wait([p.sentinel for p in self.processes], timeout=0))
        for rank, process in enumerate(self.processes):
            if rank not in answers and (process.sentinel in exited or not process.is_alive()):
                process.join(1.0)
                reason = _exit_reason(process.exitcode)
                return RankFailed(
                    "crash", f"rank {rank} died ({reason}) during {op}; the group was stopped"
                )
        return None

    def _hung(self, op: str, silent: list[int], timeout: float) -> RankFailed:
        """Ask the silent ranks where they are; the ones not waiting for their peers are the
        hung ones (the rest wait in a collective for them)."""
        where = {r: self._where(r) for r in silent}
        self.kill()
        culprits = [r for r in silent if not where[r].get("waiting_on_peers")] or silent
        detail = "; ".join(
            f"rank {r} at {where[r].get('at', '?')}" for r in culprits
        )
        ranks = ", ".join(str(r) for r in culprits)
        return RankFailed(
            "crash",
            f"rank {ranks} hung: no answer to {op} for {timeout:.0f} s ({detail}); the group "
            "was stopped",
        )

    def _where(self, rank: int) -> dict:
        probe = self.probes[rank]
        with contextlib.suppress(OSError, EOFError):
            probe.send("where")
            if probe.poll(1.0):
                return probe.recv()
        return {"at": "no answer"}


@dataclass
class GroupTrainer(Trainer):
    """A Trainer whose run lives in the ranks of `group`; the figures are the group's."""

    group: RankGroup | None = None
    rank_records: list[list[StepRecord]] = field(default_factory=list)
    rank_reserved: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.world_size = self.config.devices
        self._flops_per_item: float | None = None
        self._waiting: dict[int, dict[int, StepRecord]] = {}
        self._slowest_ms = 0.0

    def build(self) -> None:
        if not self.group.alive:
            self.group.start()
        answers = self.group.call(
            "build", self.config, self.warmup_steps, self.device_name,
            timeout=SLOW_TIMEOUT_S,
        )
        self.report = answers[0]["report"]
        self._flops_per_item = answers[0]["flops_per_item"]
        self.rank_records = [[] for _ in range(self.world_size)]
        self.rank_reserved = [None] * self.world_size

    def step(self) -> list[StepRecord]:
        warming = self._step < self.warmup_steps
        timeout = SLOW_TIMEOUT_S if warming else max(HANG_S, HANG_STEPS * self._slowest_ms / 1e3)
        answers = self.group.call("step", timeout=timeout, what=f"step {self._step}")
        self._step += 1
        return self._combine(answers)

    def finish(self) -> list[StepRecord]:
        return self._combine(self.group.call("finish", timeout=SLOW_TIMEOUT_S))

    def restart_clock(self) -> None:
        self.group.call("restart_clock", timeout=SLOW_TIMEOUT_S)

    def profile(self, steps: int, trace_path: str | None, measured_step_ms: float | None,
                compile_before: dict | None = None) -> dict:
        """The run's profile, taken in the ranks where it trains: rank 0's (its timeline holds
        the collectives as every rank's does), with each rank's verdict and step time beside it."""
        answers = self.group.call("profile", steps, trace_path, measured_step_ms,
                                  timeout=SLOW_TIMEOUT_S, what="profile")
        profile = dict(answers[0])
        profile["ranks"] = [{"rank": r, "bottleneck": a.get("bottleneck"),
                             "step_ms": a.get("step_ms"),
                             "communication": (a.get("categories") or {}).get("communication")}
                            for r, a in enumerate(answers)]
        return profile

    def close(self) -> None:
        if self.group is not None and self.group.alive:
            with contextlib.suppress(RankFailed):
                self.group.call("close", timeout=CLOSE_TIMEOUT_S)

    def _combine(self, answers: list[dict]) -> list[StepRecord]:
        # Per device, as the peak: the largest rank's (FSDP2's shards differ by their padding).
        parts = [a["memory_parts"] for a in answers if a.get("memory_parts")]
        if parts:
            self.memory_parts = {k: max(p[k] for p in parts) for k in parts[0]}
        for rank, answer in enumerate(answers):
            self.rank_reserved[rank] = answer["peak_reserved_bytes"]
            for values in answer["records"]:
                record = StepRecord(*values)
                self.rank_records[rank].append(record)
                self._waiting.setdefault(record.step, {})[rank] = record
        done = []
        for step in sorted(self._waiting):
            ranks = self._waiting[step]
            if len(ranks) < self.world_size:
                break
            del self._waiting[step]
            by_rank = [ranks[r] for r in range(self.world_size)]
            record = StepRecord(
                step=step,
                step_ms=max(r.step_ms for r in by_rank),
                loss=statistics.fmean(r.loss for r in by_rank),
                memory_allocated_bytes=max(r.memory_allocated_bytes for r in by_rank),
                peak_memory_bytes=max(r.peak_memory_bytes for r in by_rank),
                rank_step_ms=tuple(r.step_ms for r in by_rank),
                optimizer_ms=max((r.optimizer_ms for r in by_rank if r.optimizer_ms is not None),
                                 default=None),
            )
            if step == 0:
                self.first_step_s = record.step_ms / 1e3
            else:
                self._slowest_ms = max(self._slowest_ms, record.step_ms)
            self.records.append(record)
            done.append(record)
        return done

    def mfu(self, step_ms: float) -> float | None:
        if self._flops_per_item is None or self.device != "cuda":
            return None
        flops = self._flops_per_item * self.items_per_step()
        return flops / (step_ms / 1e3) / (self.peak().tflops * 1e12 * self.world_size)

    def result(self, status: str = "ok", message: str = "") -> TrialResult:
        result = super().result(status=status, message=message)
        per_rank = []
        for rank, records in enumerate(self.rank_records):
            measured = [r.step_ms for r in records if r.step >= self.warmup_steps]
            per_rank.append({
                "rank": rank,
                "step_ms": statistics.median(measured) if measured else None,
                "peak_memory_bytes": max((r.peak_memory_bytes for r in records), default=None),
                "peak_reserved_bytes": self.rank_reserved[rank],
            })
        reserved = [r for r in self.rank_reserved if r is not None]
        return replace(
            result,
            peak_reserved_bytes=max(reserved) if reserved else None,
            per_rank=tuple(per_rank),
        )

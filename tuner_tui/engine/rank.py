"""One rank of a worker group: a process that trains its slice of every batch under
torch.distributed, one command at a time, for the worker that started it (engine/group.py).

The rank joins the process group as torchrun's processes do (env:// rendezvous: MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), builds the same seeded model as every other rank,
and answers each command ("build", "step", "finish", "restart_clock", "close") with its
figures or with its failure, classified as the single-process worker classifies it. A thread
beside the training ends the process as soon as the worker is gone, and tells the worker, when
asked, where the training thread is (how a hung rank is told from the ranks waiting for it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner_tui.engine.protocol import WorkerSpec

if TYPE_CHECKING:
    from strategies.config import TuneConfig

GROUP_ENVIRON = {
    # NVLink multicast (NVLS) is off in every process of a group: the lent machines' fabric
    # does not support it, and NCCL would otherwise try it on NVLink-connected GPUs.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

COLLECTIVE_TIMEOUT_S = 1800.0
"""torch.distributed's own timeout for a collective. Long, because the ranks compile apart and
one may wait minutes at its first collective for a slower one; the worker's own watch notices
a dead or hung rank far sooner (group.py) and ends the group."""


@dataclass(frozen=True)
class RankSpec:
    worker: WorkerSpec
    device: str
    """"cuda" or "cpu"; rank r uses GPU r."""
    rank: int
    world_size: int
    port: int


def _die_with_parent(parent_pid: int) -> None:
    """End this process when the worker ends, even while training is stuck in a collective."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:  # PR_SET_PDEATHSIG: the kernel sends SIGKILL when the parent exits
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def where_training_is() -> dict:
    """Where the main thread is now: its innermost frame, and whether it is waiting for the
    other ranks (inside torch.distributed, autograd's backward with its gradient hooks, or a
    device synchronisation) rather than stuck on its own."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return {"at": "?", "waiting_on_peers": False}
    stack = traceback.extract_stack(frame)
    waiting_marks = ("torch/distributed", "torch/autograd", "torch/nn/parallel", "synchronize")
    waiting = any(
        any(mark in f"{f.filename}:{f.name}" for mark in waiting_marks) for f in stack
    )
    last = stack[-1]
    return {
        "at": f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}",
        "waiting_on_peers": waiting,
    }


def _watch(parent_pid: int, probe) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        try:
            if probe.poll(0.2):
                probe.recv()
                probe.send(where_training_is())
        except (EOFError, OSError):
            os._exit(1)


class Rank:
    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.trainer = None
        self.compile_before: dict | None = None
        self.fault = _parse_fault(spec.worker.fault_injection, spec.rank)

    def setup(self) -> dict:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from tuner_tui.engine import workloads

        cuda = self.spec.device == "cuda"
        if cuda:
            torch.cuda.set_device(self.spec.rank)
        else:  # the ranks share the cores, as torchrun's processes do (it sets OMP_NUM_THREADS)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.spec.world_size))
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
            device_id=torch.device("cuda", self.spec.rank) if cuda else None,
        )
        w = self.spec.worker
        name = workloads.resolve_name(w.workload, self.spec.device)
        self.workload = workloads.load(name, w.sequence_length, w.seed, w.data, self.spec.device)
        return {"pid": os.getpid()}

    def build(self, config: TuneConfig, warmup: int, device_name: str) -> dict:
        from tuner_tui.engine.trial import Trainer

        from tuner_tui.engine.profiler import compile_counters

        self.close()
        self.trainer = Trainer(
            workload=self.workload, config=config, device=self.spec.device,
            seed=self.spec.worker.seed, warmup_steps=warmup, device_name=device_name,
            rank=self.spec.rank, world_size=self.spec.world_size,
        )
        self.compile_before = compile_counters()
        self.trainer.build()
        flops = self.workload.flops_per_item
        model = self.trainer.tuned.model
        # The workload counts FLOPs on its own model (it may call its methods), not on DDP's
        # wrapper (fully_shard keeps the model's class).
        model = getattr(model, "module", model)
        return {
            "report": self.trainer.report,
            "flops_per_item": flops(model) if flops else None,
        }

    def step(self) -> dict:
        self._inject_fault(self.trainer._step)
        return self._records(self.trainer.step())

    def finish(self) -> dict:
        return self._records(self.trainer.finish())

    def profile(self, steps: int, trace_path: str | None, measured_step_ms: float | None) -> dict:
        """This rank's profile of `steps` more steps (every rank profiles, since every rank must
        step for the collectives to complete); a trace file per rank."""
        if trace_path and self.spec.world_size > 1:
            path = Path(trace_path)
            trace_path = str(path.with_name(f"{path.stem}-rank{self.spec.rank}{path.suffix}"))
        return self.trainer.profile(steps, trace_path, measured_step_ms, self.compile_before)

    def restart_clock(self) -> None:
        self.trainer.restart_clock()

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None

    def _records(self, records) -> dict:
        import torch

        reserved = torch.cuda.max_memory_reserved() if self.spec.device == "cuda" else None
        return {"records": [astuple(r) for r in records], "peak_reserved_bytes": reserved,
                "memory_parts": self.trainer.memory_parts}

    def _inject_fault(self, step: int) -> None:
        """Test hook (WorkerSpec.fault_injection = "rank:R:KIND:STEP"): rank R fails at step
        STEP by running out of memory (torch's real exception), exiting, or hanging."""
        if self.fault is None or self.fault[1] != step:
            return
        kind = self.fault[0]
        if kind == "oom":
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 64.00 GiB. (injected by "
                "WorkerSpec.fault_injection)"
            )
        if kind == "exit":
            os._exit(3)
        if kind == "hang":
            while True:
                time.sleep(1.0)


def _parse_fault(fault: str | None, rank: int) -> tuple[str, int] | None:
    if not fault or not fault.startswith("rank:"):
        return None
    _, which, kind, step = fault.split(":")
    return (kind, int(step)) if int(which) == rank else None


def rank_entry(spec: RankSpec, parent_pid: int, commands, replies, probe) -> None:
    os.environ.update(GROUP_ENVIRON)
    os.environ.update(dict(spec.worker.environ))
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec.port), RANK=str(spec.rank),
        LOCAL_RANK=str(spec.rank), WORLD_SIZE=str(spec.world_size),
        LOCAL_WORLD_SIZE=str(spec.world_size),
    )
    _die_with_parent(parent_pid)
    threading.Thread(target=_watch, args=(parent_pid, probe), daemon=True).start()
    rank = Rank(spec)
    if _answer(rank, replies, 0, "setup", ()):
        while True:
            seq, op, args = commands.get()
            if op == "exit":
                break
            _answer(rank, replies, seq, op, args)
    rank.close()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    replies.close()
    replies.join_thread()


def _answer(rank: Rank, replies, seq: int, op: str, args: tuple) -> bool:
    try:
        payload = getattr(rank, op)(*args)
    except Exception as exc:
        from tuner_tui.engine.trial import classify, describe_failure

        if classify(exc) == "crash":
            traceback.print_exc()
        replies.put((seq, rank.spec.rank, "error", (classify(exc), describe_failure(exc))))
        return False
    replies.put((seq, rank.spec.rank, "ok", payload))
    return True

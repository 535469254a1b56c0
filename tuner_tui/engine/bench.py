"""`gputune bench`: measure configurations side by side, each in a fresh worker process.

The parent process imports no torch: it validates the configurations, starts one worker per
configuration (so no configuration inherits another's compiled graphs, allocator state or
global flags), shows progress, and prints and saves the table.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from strategies.config import ConfigError, TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine import protocol
from tuner_tui.engine.client import WorkerClient, WorkerSpec

LOSS_CHECK_STEPS = 8  # mirrors trial.LOSS_CHECK_STEPS (kept here so the parent needs no torch)


def ladder() -> list[TuneConfig]:
    """The default set: the baseline (fp32 eager, manual attention), then one strategy family
    added at a time. Rows this machine cannot run are dropped by `runnable`."""
    steps = [
        {},
        {"precision": "tf32"},
        {"precision": "bf16"},
        {"precision": "bf16", "attention": "sdpa"},
        {"precision": "bf16", "attention": "sdpa", "compile_mode": "default"},
        {"precision": "bf16", "attention": "sdpa", "compile_mode": "default", "optimizer": "fused"},
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "reduce-overhead",
            "optimizer": "fused",
        },
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "default",
            "optimizer": "fused",
            "fused_kernels": ["layer_norm", "gelu", "rms_norm", "swiglu", "linear_cross_entropy"],
        },
        {
            "precision": "bf16",
            "attention": "sdpa",
            "compile_mode": "default",
            "optimizer": "fused",
            "checkpointing": "selective",
        },
    ]
    return [TuneConfig.from_dict(s) for s in steps]


def _best_known() -> dict:
    return {"precision": "bf16", "attention": "sdpa", "compile_mode": "default", "optimizer": "fused"}


PRESETS: dict[str, Callable[[], list[TuneConfig]]] = {
    "ladder": ladder,
    "quick": lambda: [
        TuneConfig.from_dict({}),
        TuneConfig.from_dict({"precision": "bf16", "attention": "sdpa", "optimizer": "foreach"}),
    ],
    "compile-modes": lambda: [
        TuneConfig.from_dict({**_best_known(), "compile_mode": mode})
        for mode in ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
    ],
    "checkpointing": lambda: [
        TuneConfig.from_dict({**_best_known(), "checkpointing": c})
        for c in ("off", "selective", "every-n", "full")
    ],
    "kernels": lambda: [
        TuneConfig.from_dict({**_best_known(), "compile_mode": "off"}),
        TuneConfig.from_dict(
            {**_best_known(), "compile_mode": "off",
             "fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"]}
        ),
        TuneConfig.from_dict(_best_known()),
        TuneConfig.from_dict(
            {**_best_known(),
             "fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy"]}
        ),
    ],
}


@dataclass
class BenchPlan:
    spec: WorkerSpec
    configs: list[TuneConfig]
    steps: int = 20
    warmup_steps: int = 5
    trial_timeout_s: float = 900.0
    overrides: dict = field(default_factory=dict)


def apply_overrides(configs: list[TuneConfig], overrides: dict) -> list[TuneConfig]:
    return [c.replace(**overrides) for c in configs] if overrides else configs


class Progress:
    """One status line per trial: rewritten in place on a terminal, printed per state change
    otherwise (logs, CI)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self.state = ""
        self.detail = ""
        self.prefix = ""
        self._last_line = ""

    def begin(self, index: int, total: int | str, label: str, note: str = "") -> None:
        """`note` adds context after the count, e.g. the search's elapsed time and best so far."""
        self.prefix = f"[{index}/{total}{' | ' + note if note else ''}] {label}"
        self.started = time.monotonic()
        self.set("starting worker")

    def set(self, state: str, detail: str = "") -> None:
        """`state` is the phase (printed once per change off a terminal); `detail` is a counter
        shown only on a terminal."""
        if state != self.state and not self.tty:
            print(f"{self.prefix}: {state}", file=self.out, flush=True)
        self.state = state
        self.detail = detail
        self.tick()

    def tick(self) -> None:
        if not self.tty:
            return
        line = f"{self.prefix}: {self.state} {self.detail} {time.monotonic() - self.started:6.1f} s"
        self.out.write("\r" + line.ljust(len(self._last_line)))
        self.out.flush()
        self._last_line = line

    def end(self, summary: str) -> None:
        if self.tty:
            self.out.write("\r" + " " * len(self._last_line) + "\r")
        print(f"{self.prefix}: {summary}", file=self.out, flush=True)
        self.state = ""


class WorkerStartError(Exception):
    """The worker could not build the workload (bad --workload or --data): a user error."""


def start_worker(spec: WorkerSpec, timeout: float = 300.0) -> tuple[WorkerClient, protocol.WorkerReady]:
    client = WorkerClient(spec)
    client.start()
    event = client.wait_event(timeout)
    while event is not None and not isinstance(event, (protocol.WorkerReady, protocol.RunFailed)):
        event = client.wait_event(timeout)
    if isinstance(event, protocol.WorkerReady):
        return client, event
    client.stop()
    if isinstance(event, protocol.RunFailed):
        raise WorkerStartError(event.message)
    raise WorkerStartError(f"the worker did not start (exit code {client.exitcode()})")


class NextWorker:
    """Starts the next trial's worker while the current trial builds, compiles and warms up.

    A worker's start (importing torch, creating a CUDA context, building the workload) costs
    seconds; a trial runs in a fresh process, so without this every trial pays it in turn.
    The current trial's measured steps are held (`WorkerClient.hold_measurement`) until the
    next worker is up, so that no process start overlaps a measurement."""

    def __init__(self, spec: WorkerSpec, start_timeout: float = 300.0) -> None:
        self.spec = spec
        self.start_timeout = start_timeout
        self._client: WorkerClient | None = None
        self._thread: threading.Thread | None = None
        self._ready: protocol.WorkerReady | None = None

    def begin(self, current: WorkerClient) -> None:
        """Start the next worker; `current`'s measured steps wait until it is up (or failed)."""
        self.close()
        current.hold_measurement()
        client = WorkerClient(self.spec)
        try:
            client.start()
        except Exception:  # no head start then: `take` starts one the usual way and says why
            current.release_measurement()
            return
        self._client, self._ready = client, None

        def watch() -> None:
            try:
                event = client.wait_event(self.start_timeout)
                while event is not None and not isinstance(
                    event, (protocol.WorkerReady, protocol.RunFailed)
                ):
                    event = client.wait_event(self.start_timeout)
                if isinstance(event, protocol.WorkerReady):
                    self._ready = event
            finally:
                current.release_measurement()

        self._thread = threading.Thread(target=watch, name="gputune-next-worker", daemon=True)
        self._thread.start()

    def keep(self, client: WorkerClient, ready: protocol.WorkerReady) -> None:
        """Hold a worker that is already up, for the next `take`."""
        self.close()
        self._client, self._ready = client, ready

    def is_ready(self) -> bool:
        return self._ready is not None

    def take(self) -> tuple[WorkerClient, protocol.WorkerReady]:
        """The worker started by `begin`, once ready; a fresh one if none was started or it
        failed to start."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        client, ready = self._client, self._ready
        self._client = self._ready = None
        if client is not None and ready is not None and client.is_alive():
            return client, ready
        if client is not None:
            client.stop()
        return start_worker(self.spec, self.start_timeout)

    def close(self) -> None:
        """Stop a worker started and not taken."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._client is not None:
            self._client.stop()
        self._client = self._ready = None


def run_one(
    client: WorkerClient,
    config: TuneConfig,
    plan: BenchPlan,
    reference: tuple[float, ...],
    progress: Progress,
    stop_if_slower_than_ms: float | None = None,
) -> protocol.TrialResult:
    client.send(protocol.RunTrial(config.to_dict(), plan.steps, plan.warmup_steps, reference,
                                  stop_if_slower_than_ms=stop_if_slower_than_ms))
    deadline = time.monotonic() + plan.trial_timeout_s
    progress.set("building")
    measured = 0
    while time.monotonic() < deadline:
        event = client.wait_event(0.25)
        progress.tick()
        if event is None:
            if not client.is_alive():
                return protocol.TrialResult(
                    config=config.to_dict(), label=config.label(), status="crash",
                    message=f"the worker process died (exit code {client.exitcode()})",
                )
            continue
        if isinstance(event, protocol.CompileStarted):
            progress.set("compiling")
        elif isinstance(event, protocol.StepMeasured):
            if event.step >= plan.warmup_steps:
                measured += 1
                progress.set("measuring", f"{measured}/{plan.steps}")
            else:
                progress.set("warming up")
        elif isinstance(event, protocol.TrialFinished):
            return event.result
        elif isinstance(event, protocol.RunFailed):
            if event.result is not None:
                return event.result
            return protocol.TrialResult(
                config=config.to_dict(), label=config.label(), status=event.kind,
                message=event.message,
            )
    return protocol.TrialResult(
        config=config.to_dict(), label=config.label(), status="crash",
        message=f"no result within {plan.trial_timeout_s:.0f} s; the worker was stopped",
    )


def runnable(configs: list[TuneConfig], caps: Capabilities) -> tuple[list[TuneConfig], list[str]]:
    keep, skipped = [], []
    for config in configs:
        try:
            config.check_runnable(caps)
            keep.append(config)
        except ConfigError as exc:
            skipped.append(f"{config.label()}: {exc}")
    return keep, skipped


def run_bench(
    plan: BenchPlan,
    out: TextIO = sys.stdout,
    strict: bool = True,
    on_result: Callable[[list[protocol.TrialResult], dict, dict], None] | None = None,
) -> tuple[list[protocol.TrialResult], dict, dict]:
    """Measure every configuration of the plan. Returns (results, environment, workload).

    With strict (configurations the user named), a configuration this machine cannot run is a
    ConfigError before anything runs; otherwise (presets) such rows are skipped with a note.
    `on_result(results so far, environment, workload)` is called after each row, so that a
    bench cut short (a timeout, a killed terminal) keeps the rows it measured.
    """
    progress = Progress(out)
    client, ready = start_worker(plan.spec)
    caps = Capabilities(**ready.capabilities)
    configs = apply_overrides(plan.configs, plan.overrides)
    if strict:
        for config in configs:
            config.check_runnable(caps)
    else:
        configs, skipped = runnable(configs, caps)
        for line in skipped:
            print(f"skipped {line}", file=out)
    workload = ready.workload
    default_batch = workload["default_batch_size"]
    # Keyed by (batch size, gradient clip): both change the losses a configuration must match.
    references: dict[tuple[int, float], tuple[float, ...]] = {}
    results: list[protocol.TrialResult] = []
    total = len(configs)
    next_worker = NextWorker(plan.spec)
    try:
        for index, config in enumerate(configs, start=1):
            batch = config.batch_size or default_batch
            key = (batch, config.grad_clip)
            if key not in references and not computes_reference(config):
                progress.begin(index, total, f"fp32 reference losses (batch {batch})")
                reference = TuneConfig.reference(config.batch_size).replace(
                    grad_clip=config.grad_clip
                )
                next_worker.begin(client)
                ref = run_one(
                    client, reference,
                    BenchPlan(plan.spec, [], steps=1, warmup_steps=LOSS_CHECK_STEPS - 1),
                    (), progress,
                )
                references[key] = tuple(ref.losses)
                progress.end(f"{len(ref.losses)} losses" if ref.status == "ok" else ref.status)
                client.stop()
                client, _ = next_worker.take()
            progress.begin(index, total, config.label())
            if index < total:
                next_worker.begin(client)
            result = run_one(client, config, plan, references.get(key, ()), progress)
            if computes_reference(config) and result.status == "ok":
                references.setdefault(key, tuple(result.losses[:LOSS_CHECK_STEPS]))
            results.append(result)
            progress.end(_summary(result))
            if on_result is not None:
                on_result(results, ready.environment, workload)
            client.stop()
            if index < total:
                client, _ = next_worker.take()
    finally:
        client.stop()
        next_worker.close()
    return results, ready.environment, workload


def computes_reference(config: TuneConfig) -> bool:
    """Computes what the fp32 eager reference computes (attention, optimizer implementation
    and checkpointing change how, not what), so its own losses are the reference. A group's
    losses are checked against one process instead."""
    return (config.precision == "fp32" and config.compile_mode == "off"
            and not config.fused_kernels and config.parallel == "none")


def _summary(r: protocol.TrialResult) -> str:
    if r.status == "ok" and r.tokens_per_s:
        text = f"{_si(r.tokens_per_s)} tokens/s, {r.step_ms:.1f} ms/step"
        if r.per_rank:
            ranks = len(r.per_rank)
            text += (f" (slowest of {ranks} ranks; global batch {r.batch_size} = {ranks} x "
                     f"{r.batch_size // ranks}/rank)")
        return text
    return f"{r.status}: {r.message}" if r.message else r.status


def _si(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def format_table(
    results: list[protocol.TrialResult], baseline: float | None = None, item_name: str = "tokens"
) -> str:
    """`baseline`: tokens/s that the "x base" column divides by; without it, "x first" divides
    by the first row's. `item_name`: what the workload counts (tokens, images, samples)."""
    base = baseline or next((r.tokens_per_s for r in results if r.tokens_per_s), None)
    headers = ["#", "configuration", f"{item_name}/s", "x base" if baseline else "x first", "step ms",
               "MFU", "peak GiB", "compile s", "loss", "status"]
    rows = []
    for i, r in enumerate(results, start=1):
        ratio = f"{r.tokens_per_s / base:.2f}x" if (r.tokens_per_s and base) else "-"
        loss = {True: "ok", False: "MISMATCH", None: "-"}[r.loss_ok]
        if r.loss_ok is not None and r.loss_max_rel_error is not None:
            loss += f" {r.loss_max_rel_error:.1e}"
        rows.append([
            str(i), r.label,
            _si(r.tokens_per_s) if r.tokens_per_s else "-",
            ratio,
            f"{r.step_ms:.1f}" if r.step_ms else "-",
            f"{r.mfu:.1%}" if r.mfu is not None else "-",
            _gib(r.peak_memory_bytes),
            f"{r.compile_s:.1f}" if r.compile_s is not None else "-",
            loss,
            r.status,
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    peaks = sorted({r.mfu_peak_source for r in results if r.mfu_peak_source})
    if peaks:
        lines.append("MFU peaks: " + "; ".join(peaks))
    return "\n".join(lines)


def best(results: list[protocol.TrialResult]) -> protocol.TrialResult | None:
    """The fastest configuration that ran and kept the reference's loss."""
    good = [r for r in results if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False]
    return max(good, key=lambda r: r.tokens_per_s) if good else None


def write_json(path: str | Path, results, environment: dict, workload: dict, plan: BenchPlan) -> None:
    doc = {
        "tool": "gputune bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": workload,
        "steps": plan.steps,
        "warmup_steps": plan.warmup_steps,
        "environment": environment,
        "results": [r.to_dict() for r in results],
    }
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)

"""Messages between the UI (or a headless driver) and the worker process.

Commands are imperative and go to the worker; events are past tense and come back. All are
frozen dataclasses of plain Python values (no tensors), so they pickle across a spawn
`multiprocessing.Queue`. This module imports no torch: the dashboard imports it.

Configurations travel as `TuneConfig` (torch-free, frozen, validated: what arrives is what was
sent), results as `TrialResult`, whose `config` is the plain dict it is stored and written as
(`TrialResult.tune_config` reads it back).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from strategies.config import TuneConfig

# -- what a worker trains -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker trains: everything it needs to build the run, as plain values."""

    workload: str = "auto"
    device: str = "auto"
    data: str | None = None
    seed: int = 0
    sequence_length: int | None = None
    fault_injection: str | None = None
    """Test hook: "oom" makes every build raise torch's real OutOfMemoryError path;
    "oom-above:N" does so only for batch sizes above N, and "oom-above:N:fp32" only for those
    of one precision (fp32 needs the most memory: its reference may not fit where bf16 does);
    "rank:R:KIND:STEP" makes rank R of a group fail at step STEP (KIND: oom, exit, hang);
    "grad:<kernel>:<fault>" breaks one kernel's backward (engine/faults.py), for the tests of
    the gradient gate; "noisy-steps:MS" makes every step sleep a random 0..MS ms inside its
    timed part (a busy neighbour), for the tests of the noise handling."""
    environ: tuple[tuple[str, str], ...] = ()
    """Environment variables set in the worker before it imports torch (e.g. the Inductor
    cache directory that the search's trials share)."""
    log_path: str | None = None
    """The run's log file (`worker_log.new_run_log`): the worker's standard output and error go
    there, not to the terminal; None leaves them where they are."""


# -- commands (UI -> worker) ----------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyConfig:
    """Rebuild the run with this configuration (same initial weights and batches) and train on,
    reporting a `TrialFinished` once the measurement window is over."""

    config: TuneConfig
    measure_steps: int = 20
    max_steps: int | None = None
    """While the measured steps' spread is over noise.NOISY_SPREAD, measure on up to this many
    steps before reporting (None: noise.ADAPTIVE_FACTOR x measure_steps)."""


@dataclass(frozen=True)
class RunTrial:
    """Measure one configuration for a fixed number of steps, report it, then wait."""

    config: TuneConfig
    steps: int = 20
    warmup_steps: int = 5
    reference_losses: tuple[float, ...] = ()
    stop_if_slower_than_ms: float | None = None
    """Early stop: once `stop_after_steps` steps are measured, a median step time above this
    ends the trial with status "stopped" (the search already has a clearly faster one)."""
    stop_after_steps: int = 3
    stop_reference_spread: float = 0.0
    """The spread of the row `stop_if_slower_than_ms` comes from: the early stop needs a gap
    larger than this and the trial's own spread combined (noise.clearly_slower), over at least
    noise.STOP_MIN_STEPS steps."""
    max_steps: int | None = None
    """While the measured steps' spread is over noise.NOISY_SPREAD, measure on up to this many
    steps (None: noise.ADAPTIVE_FACTOR x steps; `steps` turns the adaptation off)."""
    profile_steps: int = 0
    """After the measured steps, profile this many more (0: none); the result's `profile`."""
    trace_path: str | None = None
    """Where to write the profiler's Chrome/Perfetto trace (with profile_steps)."""
    reference_dir: str | None = None
    """The reference cache's entry for this trial's batch (`reference_cache.py`): the sketch of
    the fp32 reference's gradients is read from it, or computed once and written there."""


@dataclass(frozen=True)
class ProfileRun:
    """Profile the live run over a few steps once its measurement window is over (the next
    run's, if another configuration is applied first); answered by `ProfileMeasured`."""

    steps: int = 3
    trace_path: str | None = None


@dataclass(frozen=True)
class CompileOptimizerSteps:
    """Compile torchao's AdamW step for each (weights, optimizer_state) of `variants`, in turn,
    into the shared Inductor cache (`engine/optimizer_steps.py`), at the lowest CPU priority;
    answered by one `OptimizerStepsCompiled` each. A worker given this does nothing else."""

    variants: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Pause:
    pass


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


Command = ApplyConfig | RunTrial | ProfileRun | CompileOptimizerSteps | Pause | Resume | Shutdown

# -- events (worker -> UI) ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    capabilities: dict
    environment: dict
    workload: dict
    """`Workload.describe()` with the run's seed and data: name, items_per_sample, item_name
    (tokens, images, samples), default_batch_size, inapplicable (the options that change
    nothing in the model, `strategies.applicability`), changes_training (the options that would
    train it differently, such as micro-batches under BatchNorm), seed, data."""
    startup_s: dict = field(default_factory=dict)
    """How long each part of this worker's start took, in seconds: "python" (the interpreter
    and gputune's imports, from the process's creation), "torch" (its import), "workload" (the
    user's code loading it), "first batch" (its first batch on the device, which starts CUDA),
    "machine" (what the device can do) and "model facts" (which options apply to the model, from
    a copy built on the meta device)."""


@dataclass(frozen=True)
class RunStarted:
    run_id: int
    config: TuneConfig
    label: str
    batch_size: int
    warmup_steps: int = 5
    """Steps before the measured ones (the first holds torch.compile's work): the dashboard's
    plots mark them and leave them out of their scale."""


@dataclass(frozen=True)
class CompileStarted:
    run_id: int
    what: str = "torch.compile"
    """What the first step builds once (torch.compile, torchao's compiled optimizer step)."""


@dataclass(frozen=True)
class StepPart:
    run_id: int
    step: int
    part: str
    """ "forward" or "backward": one micro-batch's part of a warm-up step is done (step 0: also
    each pass of the fp32 reference's gradients, before the trial is built). A trial far slower
    than planned shows by these that it works before its first step ends."""


@dataclass(frozen=True)
class CompileFinished:
    run_id: int
    seconds: float


@dataclass(frozen=True)
class StepMeasured:
    run_id: int
    step: int
    step_ms: float
    tokens_per_s: float
    loss: float
    mfu: float | None
    memory_allocated_bytes: int
    peak_memory_bytes: int
    wall_time: float
    rank_step_ms: tuple[float, ...] = ()
    """In a group (parallel != none): each rank's time for this step, by rank; `step_ms` is the
    slowest of them."""


MEASURED_KEYS = (
    "status", "tokens_per_s", "samples_per_s", "step_ms", "step_ms_min", "step_ms_max",
    "step_ms_q1", "step_ms_q3", "mfu", "mfu_peak_tflops", "mfu_peak_source", "peak_memory_bytes", "peak_reserved_bytes",
    "compile_s", "warmup_s", "measured_steps", "batch_size", "sequence_length", "device",
    "loss_ok", "loss_max_rel_error", "grad_ok", "grad_min_cosine",
)
"""The figures of a `TrialResult` that travel with an exported configuration."""


@dataclass(frozen=True)
class TrialResult:
    """One configuration's measured figures; the row of the leaderboard and of `bench --json`."""

    config: dict
    label: str
    status: str
    """ok, oom, diverged, compile, crash, invalid, loss-mismatch (ran, but the loss left the
    tolerance of the fp32 reference), numerics (ran, but the first step's gradients left the
    tolerance of the fp32 reference's; the message names the worst tensor), stopped (stopped
    early as clearly slower than the best), timeout (stopped by the search at its time budget's
    end, before it gave a result), skipped (not run: the search estimated it would not fit in
    the memory budget)."""
    workload: str = ""
    item_name: str = "tokens"
    """What the workload counts (tokens, images, samples): the unit of `tokens_per_s`."""
    device: str = ""
    batch_size: int = 0
    sequence_length: int = 0
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_ms: float | None = None
    step_ms_min: float | None = None
    step_ms_max: float | None = None
    step_ms_q1: float | None = None
    step_ms_q3: float | None = None
    """Quartiles of the measured steps' times: the spread behind the median (noise.spread)."""
    optimizer_ms: float | None = None
    """The optimizer step's part of step_ms (clipping, the update, zeroing the gradients),
    median over the measured steps: what more micro-batches per step would share."""
    mfu: float | None = None
    mfu_peak_tflops: float | None = None
    mfu_peak_source: str = ""
    peak_memory_bytes: int | None = None
    """Largest memory allocated by tensors (torch.cuda.max_memory_allocated); on the CPU, the
    growth of the worker's resident memory."""
    peak_reserved_bytes: int | None = None
    compile_s: float | None = None
    """First step, which holds torch.compile's work (or an eager first step)."""
    first_step_builds: str = ""
    """What that first step built once besides the step itself ("" for nothing): torch.compile,
    torchao's compiled optimizer step."""
    warmup_s: float | None = None
    measured_steps: int = 0
    phases_s: dict = field(default_factory=dict)
    """Seconds the worker spent on each part of the trial, in order: "reference gradients"
    (the fp32 reference's sketch, computed or read), "build", "first step", "warm-up", "held"
    (the measured steps waiting while another gputune process started or ended), "measured",
    "profile"; empty where the trial did not get that far."""
    losses: tuple[float, ...] = ()
    loss_ok: bool | None = None
    loss_max_rel_error: float | None = None
    loss_tolerance: float | None = None
    grad_ok: bool | None = None
    """The first step's gradients against the fp32 reference's (gradients.compare); None:
    not compared."""
    grad_worst_tensor: str = ""
    grad_min_cosine: float | None = None
    grad_worst_norm_ratio: float | None = None
    message: str = ""
    strategy_report: dict = field(default_factory=dict)
    """What each strategy did, e.g. {"fused_kernels": {"layer_norm": 25}}."""
    memory_parts: dict = field(default_factory=dict)
    """Bytes on the training device after the first optimizer step, each storage counted once:
    {"parameters": ..., "gradients": ..., "optimizer_state": ...}; empty if no step ran."""
    parameter_shapes: int = 0
    """How many distinct shapes (and dtypes) the trainable parameters take (0: not counted):
    torchao's AdamW compiles its step once for each."""
    model_shape: dict = field(default_factory=dict)
    """The transformer's shapes the memory model's priors use (`memory_prior.ModelShape`:
    layers, hidden, intermediate, heads, kv_heads, vocab, seq_len); empty where the model does
    not say them."""
    memory_estimate: dict = field(default_factory=dict)
    """The search's estimate of the peak made before the trial ran, part by part (parameters,
    gradients, optimizer_state, activations, total, basis: the trial it scaled from); empty
    where nothing was measured before it."""
    per_rank: tuple[dict, ...] = ()
    """In a group (parallel != none), one entry per rank: rank, step_ms (its median),
    peak_memory_bytes, peak_reserved_bytes. The group's figures above are all ranks' tokens,
    the slowest rank's step time and the largest rank's peak."""
    profile: dict = field(default_factory=dict)
    """Where the step's time goes (`engine/profile.py`), when profiled; {} otherwise."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["losses"] = list(self.losses)
        d["per_rank"] = [dict(r) for r in self.per_rank]
        return d

    def measured(self) -> dict[str, Any]:
        """The figures an exported file's [measured] table holds (`MEASURED_KEYS`), known ones
        only."""
        d = self.to_dict()
        return {k: d[k] for k in MEASURED_KEYS if d.get(k) not in (None, "")}

    @functools.cached_property
    def tune_config(self) -> TuneConfig:
        """`config` as a `TuneConfig`, parsed once (ConfigError for a stored configuration that
        this version no longer accepts)."""
        return TuneConfig.from_dict(self.config)

    @classmethod
    def from_dict(cls, d: dict) -> "TrialResult":
        known = {f for f in cls.__dataclass_fields__}
        data = {k: v for k, v in d.items() if k in known}
        data["losses"] = tuple(data.get("losses", ()))
        data["per_rank"] = tuple(dict(r) for r in data.get("per_rank", ()))
        return cls(**data)


def measured_peak(result: TrialResult) -> int | None:
    """What counts against a memory budget: the larger of the allocated and reserved peaks."""
    peaks = [p for p in (result.peak_memory_bytes, result.peak_reserved_bytes) if p]
    return max(peaks) if peaks else None


@dataclass(frozen=True)
class TrialFinished:
    run_id: int
    result: TrialResult


@dataclass(frozen=True)
class RunFailed:
    run_id: int
    kind: str
    """oom, diverged, compile, crash, invalid."""
    message: str
    result: TrialResult | None = None


@dataclass(frozen=True)
class ProfileMeasured:
    """The profile of run `run_id` (`engine/profile.py`), as asked by `ProfileRun`."""

    run_id: int
    profile: dict


@dataclass(frozen=True)
class OptimizerStepsCompiled:
    """The optimizer step of `weights` and `state` compiled in `seconds` (`error`: why not)."""

    weights: str
    state: str
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class Paused:
    pass


@dataclass(frozen=True)
class Resumed:
    pass


@dataclass(frozen=True)
class WorkerLog:
    """A line worth showing the user (a warning from a strategy, a recompile, ...)."""

    level: str
    text: str
    source: str = ""
    """"" for the worker's own lines; else the library that logged it (torch, torchao,
    transformers, warnings): those go to the dashboard's log view only."""


Event = (
    WorkerReady
    | RunStarted
    | CompileStarted
    | CompileFinished
    | StepPart
    | StepMeasured
    | TrialFinished
    | RunFailed
    | ProfileMeasured
    | OptimizerStepsCompiled
    | Paused
    | Resumed
    | WorkerLog
)

FAILURE_KINDS = ("oom", "diverged", "compile", "crash", "invalid")

"""The description of every option gputune can tune, as plain data.

This module imports no torch: the dashboard builds its toggles from it, the CLI builds its
error messages from it, and the configuration validates against it. Each strategy lives in its
own module, `strategies/<name>.py`, that exposes `apply(run, config)`; `strategies/compose.py`
lists them in the order it applies them (as torchtitan does: weights and precision, kernel swap,
float8, activation checkpointing, data-parallel wrapping, compile, optimizer), the same order as
`STRATEGIES` here (a test keeps the two in step).

Adding a strategy: write `strategies/<name>.py` with `apply(run, config)`, add one
`Strategy(...)` below, and its `apply` in its place in `compose.APPLY_ORDER`. Each option also
gets its type in `TuneConfig` (for type checkers; a test names any that is missing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from strategies.errors import ConfigError

# Names of the kernels in `kernels/` that the fused-kernels strategy can swap in. Kept here as
# data (not imported from kernels/) so that the registry stays free of torch and triton.
FUSED_KERNEL_CHOICES = (
    "causal_softmax",
    "layer_norm",
    "rms_norm",
    "cross_entropy",
    "linear_cross_entropy",
    "swiglu",
    "gelu",
)


MAX_BATCH_SIZE = 2**20
"""Samples per optimizer step: far above any batch that fits one machine, low enough that a
typo (1e23) is refused with a message instead of overflowing in the worker."""


def _shown(value: Any, limit: int = 40) -> str:
    """A value as the user wrote it, cut short: a message stays one readable line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Option:
    """One tunable setting. Each kind of value is a subclass with its own `coerce` (check a value
    from a file or a dict), `parse` (a command-line string), `describe_allowed` (for messages),
    `show` and the hints the dashboard builds its widget from (`widget`)."""

    key: str
    """Flat, unique name: the TOML key, the CLI flag (`--set key=value`) and the widget id."""
    default: Any
    help: str
    """One line shown beside the widget and in error messages."""
    requires: tuple[str, ...] = ()
    """Capabilities the option needs whenever it is not at its default (see `Capabilities`)."""
    label: str = ""

    kind: ClassVar[str] = ""
    """The kind's name, as plain data: "choice", "bool", "int", "float" or "set"."""
    widget: ClassVar[str] = ""
    """The dashboard's control: "select", "switch", "number" or "checkboxes"."""

    def coerce(self, value: Any) -> Any:
        """`value` checked and in canonical form; ConfigError (one line) if not allowed."""
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        """A command-line string (`--set key=value`) as a value to `coerce`."""
        return text

    def parse_one_of_several(self, text: str) -> Any:
        """One value in a comma-separated list of values (`--search key=a,b`, the screenshot
        tool's `--set`): the same as `parse` except for sets, whose items are joined by +."""
        return self.parse(text)

    def describe_allowed(self) -> str:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        """A value as the user writes it."""
        return str(value).lower() if isinstance(value, bool) else str(value)

    def probe(self) -> Any:
        """A value other than the default, to ask whether changing the option needs a
        capability."""
        return self.default

    def needs(self, value: Any) -> tuple[str, ...]:
        """The capabilities `option = value` needs."""
        return self.requires if value != self.default else ()

    def _refuse(self, value: Any, problem: str) -> ConfigError:
        return ConfigError(f"{self.key} = {_shown(value)} {problem}: {self.describe_allowed()}")


@dataclass(frozen=True)
class ChoiceOption(Option):
    choices: tuple = ()
    choice_requires: dict = field(default_factory=dict)
    """Capabilities needed by particular choices, e.g. {"fp16": ("cuda",)}."""

    kind: ClassVar[str] = "choice"
    widget: ClassVar[str] = "select"

    def coerce(self, value: Any) -> Any:
        if value not in self.choices:
            raise self._refuse(value, "is not allowed")
        return value

    def describe_allowed(self) -> str:
        return "one of " + ", ".join(str(c) for c in self.choices)

    def needs(self, value: Any) -> tuple[str, ...]:
        return super().needs(value) + tuple(self.choice_requires.get(value, ()))


@dataclass(frozen=True)
class BoolOption(Option):
    kind: ClassVar[str] = "bool"
    widget: ClassVar[str] = "switch"

    def coerce(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise self._refuse(value, "has the wrong type")
        return value

    def parse(self, text: str) -> Any:
        lowered = text.lower()
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
        return text

    def describe_allowed(self) -> str:
        return "true or false"

    def probe(self) -> Any:
        return not self.default


@dataclass(frozen=True)
class IntOption(Option):
    minimum: float | None = None
    maximum: float | None = None

    kind: ClassVar[str] = "int"
    widget: ClassVar[str] = "number"
    input_type: ClassVar[str] = "integer"
    """What the dashboard's number field accepts: "integer" or "number"."""

    def _in_range(self, value: float) -> bool:
        return (self.minimum is None or value >= self.minimum) and (
            self.maximum is None or value <= self.maximum)

    def coerce(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._refuse(value, "has the wrong type")
        if not self._in_range(value):
            raise self._refuse(value, "is out of range")
        return value

    def parse(self, text: str) -> Any:
        try:
            return int(text)
        except ValueError:
            return text

    def describe_allowed(self) -> str:
        return self._noun("an integer", int)

    def _noun(self, noun: str, shown: type) -> str:
        if self.minimum is not None:
            noun += f" >= {shown(self.minimum)}"
        if self.maximum is not None:
            noun += f"{' and' if self.minimum is not None else ''} <= {shown(self.maximum)}"
        return noun

    def probe(self) -> Any:
        return self.default + 1


@dataclass(frozen=True)
class FloatOption(IntOption):
    kind: ClassVar[str] = "float"
    input_type: ClassVar[str] = "number"

    def coerce(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(value, "has the wrong type")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not self._in_range(number):
            raise self._refuse(value, "is out of range")
        return number

    def parse(self, text: str) -> Any:
        try:
            return float(text)
        except ValueError:
            return text

    def describe_allowed(self) -> str:
        return self._noun("a number", float)


@dataclass(frozen=True)
class SetOption(Option):
    """A subset of `choices`, held in the registry's order (equal sets compare equal)."""

    choices: tuple = ()

    kind: ClassVar[str] = "set"
    widget: ClassVar[str] = "checkboxes"

    def coerce(self, value: Any) -> Any:
        if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
            raise self._refuse(value, "has the wrong type")
        for item in value:
            if item not in self.choices:
                raise ConfigError(f"{self.key} contains {_shown(item)}, which is not allowed: "
                                  f"{self.describe_allowed()}")
        return tuple(c for c in self.choices if c in set(value))

    def parse(self, text: str) -> Any:
        return tuple(t.strip() for t in text.split(",") if t.strip())

    def parse_one_of_several(self, text: str) -> Any:
        """`a+b`, or `none` for the empty set."""
        return () if text == "none" else tuple(t for t in text.split("+") if t)

    def describe_allowed(self) -> str:
        return "a list drawn from " + ", ".join(self.choices)

    def show(self, value: Any) -> str:
        return "[" + ", ".join(value) + "]"

    def probe(self) -> Any:
        return (self.choices[0],)

    def needs(self, value: Any) -> tuple[str, ...]:
        chosen = tuple(value)
        return self.requires if chosen and chosen != tuple(self.default) else ()


@dataclass(frozen=True)
class Strategy:
    """A family of options applied together by one module."""

    name: str
    """Also the name of its module, `strategies/<name>.py`, which applies it."""
    options: tuple[Option, ...]
    help: str
    applied: bool = True
    """False for options that the training loop reads itself (batch size): no module."""


STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        "precision",
        help="Numeric precision of matmuls and activations.",
        options=(
            ChoiceOption(
                "precision",
                "fp32",
                "fp32: full precision; tf32: tensor-core fp32 matmuls; bf16/fp16: autocast "
                "(fp16 adds a GradScaler)",
                choices=("fp32", "tf32", "bf16", "fp16"),
                choice_requires={"tf32": ("cuda",), "bf16": ("bf16",), "fp16": ("cuda",)},
                label="Precision",
            ),
            FloatOption(
                "grad_clip",
                1.0,
                "Clip the global gradient norm to this value (0 turns clipping off)",
                minimum=0.0,
                label="Gradient clip",
            ),
        ),
    ),
    Strategy(
        "weights",
        help="The dtype the parameters and gradients are stored in.",
        options=(
            ChoiceOption(
                "weights",
                "fp32",
                "fp32: fp32 master weights (autocast casts per op); bf16: parameters and "
                "gradients in bf16, updated by an AdamW with stochastic rounding",
                choices=("fp32", "bf16"),
                choice_requires={"bf16": ("bf16",)},
                label="Weights",
            ),
        ),
    ),
    Strategy(
        "attention",
        help="How attention is computed in the built-in models (and the causal mask of "
        "Hugging Face models that use SDPA).",
        options=(
            ChoiceOption(
                "attention",
                "manual",
                "manual: matmul + masked softmax (what fused causal_softmax speeds up); "
                "sdpa: torch's scaled_dot_product_attention (flash attention on GPUs; in Hugging "
                "Face models, causal without a built mask where no mask is passed)",
                choices=("manual", "sdpa"),
                label="Attention",
            ),
        ),
    ),
    Strategy(
        "fused_kernels",
        help="Swap modules and functions for gputune's fused Triton kernels.",
        options=(
            SetOption(
                "fused_kernels",
                (),
                "Triton kernels to swap in (norms, activations, softmax, losses)",
                choices=FUSED_KERNEL_CHOICES,
                requires=("triton",),
                label="Fused kernels",
            ),
            ChoiceOption(
                "kernels_with_compile",
                "inductor-first",
                "With compile on: inductor-first swaps only the losses and lets Inductor fuse "
                "norms, activations and softmax into their neighbours; all swaps every chosen "
                "kernel; forced: every chosen kernel, compiled or not, even one measured slower",
                choices=("inductor-first", "all", "forced"),
                label="Kernels under compile",
            ),
        ),
    ),
    Strategy(
        "float8",
        help="float8 training of the linear layers (torchao).",
        options=(
            ChoiceOption(
                "fp8",
                "off",
                "torchao float8 matmuls in the linear layers (not the LM head, nor layers whose "
                "dims are not multiples of 16): tensorwise or rowwise scaling",
                choices=("off", "tensorwise", "rowwise"),
                requires=("fp8",),
                label="Float8",
            ),
        ),
    ),
    Strategy(
        "checkpointing",
        help="Recompute activations in the backward pass to save memory.",
        options=(
            ChoiceOption(
                "checkpointing",
                "off",
                "off; full: every block; every-n: every n-th block; selective: keep matmul and "
                "attention outputs, recompute the cheap ops",
                choices=("off", "full", "every-n", "selective"),
                label="Checkpointing",
            ),
            IntOption(
                "checkpoint_every",
                2,
                "With checkpointing = every-n: checkpoint one block in this many",
                minimum=1,
                label="Checkpoint every",
            ),
        ),
    ),
    # Data-parallel wrapping (DDP, FSDP2 per block then the root) goes here: after
    # checkpointing, before compile.
    Strategy(
        "data_parallel",
        help="Train on several GPUs (on the CPU, processes) through torch.distributed.",
        options=(
            ChoiceOption(
                "parallel",
                "none",
                "none: one device; ddp: DistributedDataParallel (a full copy per rank, gradients "
                "all-reduced); fsdp2: fully_shard (parameters, gradients and optimizer state "
                "sharded across ranks)",
                choices=("none", "ddp", "fsdp2"),
                label="Data parallel",
            ),
            IntOption(
                "devices",
                1,
                "GPUs in the group (on the CPU, processes); batch_size is split between them",
                minimum=1,
                label="Devices",
            ),
            IntOption(
                "ddp_bucket_mb",
                25,
                "With parallel = ddp: gradients are all-reduced in buckets of this many MB",
                minimum=1,
                label="DDP bucket MB",
            ),
            BoolOption(
                "ddp_bucket_view",
                False,
                "With parallel = ddp: gradient_as_bucket_view, gradients are views into the "
                "all-reduce buckets (one copy less, less memory)",
                label="DDP grads as bucket views",
            ),
            BoolOption(
                "fsdp_reshard",
                True,
                "With parallel = fsdp2: reshard_after_forward, free each block's gathered "
                "parameters after its forward and gather them again for backward (less memory, "
                "more communication)",
                label="FSDP2 reshard after forward",
            ),
        ),
    ),
    Strategy(
        "compile",
        help="torch.compile of the whole model or of each block.",
        options=(
            ChoiceOption(
                "compile_mode",
                "off",
                "torch.compile mode; off runs eagerly",
                choices=(
                    "off",
                    "default",
                    "reduce-overhead",
                    "max-autotune",
                    "max-autotune-no-cudagraphs",
                ),
                choice_requires={"reduce-overhead": ("cuda",), "max-autotune": ("cuda",)},
                label="Compile mode",
            ),
            BoolOption(
                "compile_fullgraph",
                False,
                "Fail on any graph break instead of falling back to eager for that part",
                label="Full graph",
            ),
            ChoiceOption(
                "compile_scope",
                "model",
                "model: one graph for the whole model; block: compile each repeated block "
                "(cheaper to compile)",
                choices=("model", "block"),
                label="Compile scope",
            ),
        ),
    ),
    Strategy(
        "optimizer",
        help="The AdamW update: its implementation and where and how its state is kept.",
        options=(
            ChoiceOption(
                "optimizer",
                "plain",
                "torch's AdamW: plain: one kernel per tensor; foreach: batched over tensors; "
                "fused: one fused kernel (used where torch's AdamW steps: fp32 weights with fp32 "
                "or offloaded state)",
                choices=("plain", "foreach", "fused"),
                label="AdamW",
            ),
            ChoiceOption(
                "optimizer_state",
                "fp32",
                "AdamW's moments: fp32; bf16; 8bit (torchao AdamW8bit); offload (torchao: state "
                "and step on the CPU)",
                choices=("fp32", "bf16", "8bit", "offload"),
                choice_requires={"offload": ("cuda",)},
                label="Optimizer state",
            ),
        ),
    ),
    Strategy(
        "batch",
        applied=False,
        help="Samples per optimizer step.",
        options=(
            IntOption(
                "batch_size",
                0,
                "Sequences per optimizer step (0: the workload's default)",
                minimum=0,
                maximum=MAX_BATCH_SIZE,
                label="Batch size",
            ),
            IntOption(
                "micro_batch_size",
                0,
                "Sequences per forward/backward, gradients accumulated over batch_size / "
                "micro_batch_size of them (0: the whole batch at once)",
                minimum=0,
                label="Micro-batch",
            ),
        ),
    ),
)

def _fullgraph_needs_compile(values: dict) -> str | None:
    if values["compile_fullgraph"] and values["compile_mode"] == "off":
        return "compile_fullgraph = true needs compile_mode other than off (compile_mode = off)"
    return None


def _bf16_weights_need_bf16_precision(values: dict) -> str | None:
    if values["weights"] == "bf16" and values["precision"] != "bf16":
        return (
            f"weights = bf16 needs precision = bf16 (bf16 parameters run their matmuls in bf16; "
            f"autocast keeps the losses and norms in fp32), not precision = {values['precision']}"
        )
    return None


def _devices_need_parallel(values: dict) -> str | None:
    # parallel != none with devices = 1 is allowed: a group of one process, which measures what
    # the wrapper itself costs.
    if values["devices"] > 1 and values["parallel"] == "none":
        return (
            f"devices = {values['devices']} needs parallel = ddp or fsdp2 (parallel = none "
            "trains on one device)"
        )
    return None


def _micro_batch_divides_batch(values: dict) -> str | None:
    # With several devices each rank splits its own share, batch_size / devices.
    batch, micro = values["batch_size"], values["micro_batch_size"]
    per_rank = batch // values["devices"] if batch and batch % values["devices"] == 0 else batch
    if per_rank and micro and per_rank % micro:
        return micro_batch_problem(per_rank, micro)
    return None


def micro_batch_problem(batch: int, micro: int) -> str:
    divisors = ", ".join(str(d) for d in range(1, batch + 1) if batch % d == 0)
    return (
        f"micro_batch_size = {micro} does not divide batch_size = {batch}: allowed micro-batch "
        f"sizes are 0 (the whole batch) or a divisor of {batch} ({divisors})"
    )


def _offload_without_grad_scaler(values: dict) -> str | None:
    if values["optimizer_state"] == "offload" and values["precision"] == "fp16":
        return (
            "optimizer_state = offload cannot run with precision = fp16: the GradScaler would "
            "unscale the GPU gradients after they were copied to the CPU; use precision = bf16"
        )
    return None


def _batch_divides_over_devices(values: dict) -> str | None:
    batch, devices = values["batch_size"], values["devices"]
    if batch and batch % devices:
        return (
            f"batch_size = {batch} is not a multiple of devices = {devices}: each rank trains "
            "on batch_size / devices sequences"
        )
    return None


RULES = (
    _fullgraph_needs_compile,
    _bf16_weights_need_bf16_precision,
    _micro_batch_divides_batch,
    _offload_without_grad_scaler,
    _devices_need_parallel,
    _batch_divides_over_devices,
)
"""Checks across options; each returns a message that names both options, or None."""

OPTIONS: dict[str, Option] = {o.key: o for s in STRATEGIES for o in s.options}
OPTION_STRATEGY: dict[str, str] = {o.key: s.name for s in STRATEGIES for o in s.options}


@dataclass(frozen=True)
class Capabilities:
    """What the machine a run goes to can do; plain data so the UI can hold it."""

    device: str  # "cuda" or "cpu"
    cuda: bool
    bf16: bool
    triton: bool
    gpu_name: str = ""
    fp8: bool = False
    """float8 matmuls: a CUDA GPU of compute capability 8.9 or newer."""
    reasons: dict = field(default_factory=dict)
    """Why a capability is missing, e.g. {"cuda": "no CUDA device (NVML: library not found)"}."""

    def has(self, need: str) -> bool:
        return bool(getattr(self, need))

    def why_not(self, need: str) -> str:
        return self.reasons.get(need) or f"needs {need}"

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "cuda": self.cuda,
            "bf16": self.bf16,
            "triton": self.triton,
            "gpu_name": self.gpu_name,
            "fp8": self.fp8,
            "reasons": dict(self.reasons),
        }


CAPABILITY_WORDS = {
    "cuda": "a CUDA GPU",
    "bf16": "bfloat16 support (a CUDA GPU of compute capability 8.0+, or the CPU)",
    "triton": "Triton kernels (a CUDA GPU with triton installed)",
    "fp8": "float8 matmuls (a CUDA GPU of compute capability 8.9+: Ada, Hopper or newer)",
}


def option_unavailable(option: Option, value: Any, caps: Capabilities) -> str | None:
    """Why `option = value` cannot run with `caps`, or None if it can."""
    for need in option.needs(value):
        if not caps.has(need):
            return (
                f"{option.key} = {option.show(value)} needs {CAPABILITY_WORDS.get(need, need)}, "
                f"and device = {caps.device} has none: {caps.why_not(need)}"
            )
    return None

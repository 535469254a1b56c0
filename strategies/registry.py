"""The description of every option gputune can tune, as plain data.

This module imports no torch: the dashboard builds its toggles from it, the CLI builds its
error messages from it, and the configuration validates against it. Each strategy lives in its
own module, `strategies/<name>.py`, that exposes `apply(run, config)`; `strategies/compose.py`
lists them in the order it applies them (as torchtitan does: weights and precision, kernel swap,
float8, activation checkpointing, data-parallel wrapping, compile, optimizer), the same order as
`STRATEGIES` here (a test keeps the two in step).

Adding a strategy: write `strategies/<name>.py` with `apply(run, config)`, add one
`Strategy(...)` below, and its `apply` in its place in `compose.APPLY_ORDER`. Each option also
gets its type in `TuneConfig` (for type checkers; a test names any that is missing). The
rules across options live in `strategies/rules.py`, what a machine can run in
`strategies/capabilities.py`; both are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strategies.capabilities import (  # noqa: F401  (part of this API)
    CAPABILITY_WORDS,
    Capabilities,
    option_unavailable,
)
from strategies.options import (  # noqa: F401  (Option and its kinds are part of this API)
    BoolOption,
    ChoiceOption,
    FloatOption,
    IntOption,
    Option,
    Prior,
    SearchFacts,
    SetOption,
)
from strategies.rules import RULES, micro_batch_problem  # noqa: F401  (part of this API)

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
MAX_BLOCKS = 1024
"""checkpoint_every at most: more blocks than any model has."""
MAX_DEVICES = 1024
"""devices at most: more GPUs (or CPU processes) than one host has."""
MAX_BUCKET_MB = 2**20
"""ddp_bucket_mb at most (1 TiB): DDP turns it into bytes in a 64-bit integer."""


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
                search=SearchFacts(
                    values=("fp32", "tf32", "bf16", "fp16"), activations=True,
                    reference=("fp32",),
                    numerics={"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"},
                    # GPT-2 124M on an H200, eager with SDPA: tf32 2.9x fp32, bf16 6.5x, fp16
                    # 5.7x; a 1.3B Llama bf16 about 8x. On CPUs bf16 autocast is often slower.
                    prior={"tf32": Prior((1.0, 0.25)), "bf16": Prior((1.6, 0.3), cpu=(-0.3, 0.5)),
                           "fp16": Prior((1.55, 0.3), risk=0.1)},
                    addresses=("compute", "memory"),
                ),
            ),
            FloatOption(
                "grad_clip",
                1.0,
                "Clip the global gradient norm to this value (0 turns clipping off)",
                minimum=0.0,
                label="Gradient clip",
                search=SearchFacts(lever="training", in_graph=False),
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
                "gradients in bf16, updated by an AdamW with stochastic rounding (a BatchNorm "
                "keeps fp32 beside its running statistics)",
                choices=("fp32", "bf16"),
                choice_requires={"bf16": ("bf16",)},
                label="Weights",
                search=SearchFacts(
                    values=("fp32", "bf16"), lever="both", activations=True,
                    reference=("fp32",), numerics={"bf16": "bf16"}, interacts=("optimizer",),
                    # Pays where the optimizer step and weight traffic weigh (a 1.3B Llama:
                    # bf16 weights + compile 65.5k against autocast + compile 63.5k tokens/s);
                    # about even on GPT-2 124M, where fused AdamW (fp32 weights only) wins back.
                    prior={"bf16": Prior((-0.02, 0.05), cpu=(-0.1, 0.2), large=(0.05, 0.05),
                                         risk=0.03)},
                    bytes_per_parameter={"fp32": 4, "bf16": 2},
                    addresses=("memory",),
                ),
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
                search=SearchFacts(
                    values=("manual", "sdpa"), lever="both", activations=True,
                    # GPT-2 124M bf16 eager: SDPA 2.4x the manual path (flash attention).
                    prior={"sdpa": Prior((0.5, 0.15), cpu=(0.1, 0.2), compiled=(0.35, 0.15))},
                    addresses=("compute", "memory"),
                ),
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
                search=SearchFacts(
                    values=((), ("layer_norm", "rms_norm", "gelu", "swiglu"),
                            ("layer_norm", "rms_norm", "gelu", "swiglu", "linear_cross_entropy")),
                    lever="both", activations=True, reference=((),),
                    # Per kernel; a set adds its kernels' (those Inductor fuses itself are left
                    # to it under compile, TuneConfig.effective_kernels). GPT-2 124M bf16 eager:
                    # the element-wise kernels together 1.19x.
                    prior={"layer_norm": Prior((0.04, 0.03), cpu=(-1.0, 0.5)),
                           "rms_norm": Prior((0.04, 0.03), cpu=(-1.0, 0.5)),
                           "gelu": Prior((0.03, 0.02), cpu=(-1.0, 0.5)),
                           "swiglu": Prior((0.03, 0.02), cpu=(-1.0, 0.5)),
                           "causal_softmax": Prior((0.02, 0.04), cpu=(-1.0, 0.5)),
                           "cross_entropy": Prior((0.03, 0.03), cpu=(-1.0, 0.5),
                                                  compiled=(0.0, 0.03)),
                           "linear_cross_entropy": Prior((0.04, 0.04), cpu=(-1.0, 0.5),
                                                         compiled=(0.01, 0.03), risk=0.03)},
                    addresses=("memory", "host"),
                ),
            ),
            ChoiceOption(
                "kernels_with_compile",
                "inductor-first",
                "With compile on: inductor-first swaps only the losses and lets Inductor fuse "
                "norms, activations and softmax into their neighbours; all swaps every chosen "
                "kernel; forced: every chosen kernel, compiled or not, even one measured slower",
                choices=("inductor-first", "all", "forced"),
                label="Kernels under compile",
                # Kernels kept under compile end Inductor's fusions around them (ANCHORS.md).
                search=SearchFacts(prior={"all": Prior((-0.02, 0.02)),
                                          "forced": Prior((-0.03, 0.02))}),
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
                search=SearchFacts(
                    values=("off", "tensorwise", "rowwise"), lever="both", activations=True,
                    reference=("off",), numerics={"tensorwise": "fp8", "rowwise": "fp8"},
                    # torchao float8 lost 10% on GPT-2 124M and won 10% on a 1.1B Llama (H200),
                    # compiled; without compile its casts run unfused, 1.1-3.4x slower than
                    # half precision (pytorch/ao#685): it pays only compiled.
                    prior={"tensorwise": Prior((-0.05, 0.08), large=(0.06, 0.06),
                                               eager=(-0.25, 0.15), risk=0.1),
                           "rowwise": Prior((-0.08, 0.08), large=(0.04, 0.06),
                                            eager=(-0.3, 0.15), risk=0.1)},
                    addresses=("compute",),
                    fails_with={words: ("tensorwise", "rowwise")
                                for words in ("float8", "scaled_mm")},
                    # Compiled, the linears' inputs are kept in one byte, not two; eager,
                    # torchao's casts held 2-6% more than bf16 alone (the Llamas on the H200
                    # and H100, checkpointed; GPT-2 124M).
                    holds_compiled={"off": 1, "tensorwise": 0, "rowwise": 0},
                ),
            ),
            ChoiceOption(
                "fp8_layers",
                "auto",
                "Which linears fp8 converts: auto, those large enough for float8 to pay off "
                "(torchao's size thresholds for the recipe); all, every one it can",
                choices=("auto", "all"),
                label="Float8 layers",
                # Small linears lose to float8's casts (torchao's thresholds pick the others).
                search=SearchFacts(activations=True, prior={"all": Prior((-0.02, 0.02))}),
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
                search=SearchFacts(
                    values=("off", "selective", "every-n", "full"), lever="memory",
                    activations=True,
                    # GPT-2 124M compiled: selective -1%, every block -12 to -17% (ANCHORS.md).
                    # Eager, selective runs its policy on every op: on the H200 a 1.3B HF Llama
                    # took 544 ms a step with it (and a micro-batch of 2) against 249 ms with
                    # every other block checkpointed (benchmarks/results/h200-2026-12-02/
                    # search-hf16-2), llama-1b 784-1059 ms against Liger's 147 ms unchecked.
                    prior={"selective": Prior((-0.02, 0.02), eager=(-0.4, 0.25)),
                           "every-n": Prior((-0.08, 0.03)),
                           "full": Prior((-0.17, 0.04))},
                    costs_only=("selective", "every-n", "full"),
                    # (selective and every few blocks: either may hold less than the other)
                    holds={"off": 2, "selective": 1, "every-n": 1, "full": 0},
                ),
            ),
            IntOption(
                "checkpoint_every",
                2,
                "With checkpointing = every-n: checkpoint one block in this many",
                minimum=1,
                maximum=MAX_BLOCKS,
                label="Checkpoint every",
                search=SearchFacts(activations=True),
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
                search=SearchFacts(
                    lever="parallel", reference=("none",),
                    prior={"ddp": Prior((0.0, 0.05)), "fsdp2": Prior((0.0, 0.06))},
                    addresses=("communication",),
                ),
            ),
            IntOption(
                "devices",
                1,
                "GPUs in the group (on the CPU, processes); batch_size is split between them",
                minimum=1,
                maximum=MAX_DEVICES,
                label="Devices",
            ),
            IntOption(
                "ddp_bucket_mb",
                25,
                "With parallel = ddp: gradients are all-reduced in buckets of this many MB",
                minimum=1,
                maximum=MAX_BUCKET_MB,
                label="DDP bucket MB",
                search=SearchFacts(lever="parallel", prior={100: Prior((0.0, 0.02))},
                                   addresses=("communication",)),
            ),
            BoolOption(
                "ddp_bucket_view",
                False,
                "With parallel = ddp: gradient_as_bucket_view, gradients are views into the "
                "all-reduce buckets (one copy less, less memory)",
                label="DDP grads as bucket views",
                search=SearchFacts(lever="parallel", prior={True: Prior((0.0, 0.02))}),
            ),
            BoolOption(
                "fsdp_reshard",
                True,
                "With parallel = fsdp2: reshard_after_forward, free each block's gathered "
                "parameters after its forward and gather them again for backward (less memory, "
                "more communication)",
                label="FSDP2 reshard after forward",
                search=SearchFacts(lever="parallel", prior={False: Prior((0.02, 0.03))},
                                   addresses=("communication",)),
            ),
            ChoiceOption(
                "fsdp_reduce",
                "fp32",
                "With parallel = fsdp2: the dtype gradients are reduce-scattered in; bf16 sends "
                "half the bytes of fp32, with bf16's rounding on the sum across ranks",
                choices=("fp32", "bf16"),
                label="FSDP2 gradient reduce",
                search=SearchFacts(lever="parallel", prior={"bf16": Prior((0.01, 0.03))},
                                   addresses=("communication",)),
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
                search=SearchFacts(
                    # The max-autotune modes are left out by default: their autotuning takes
                    # minutes per trial (ask with --search compile_mode=off,default,max-autotune).
                    values=("off", "default", "reduce-overhead"), activations=True,
                    reference=("off",), interacts=("fused_kernels",),
                    # GPT-2 124M bf16: compile 1.28x eager; CUDA graphs 1-2% more at batch 16-64.
                    prior={"default": Prior((0.25, 0.1), cpu=(0.05, 0.2), risk=0.04),
                           "reduce-overhead": Prior((0.26, 0.1), risk=0.06),
                           "max-autotune": Prior((0.27, 0.1), risk=0.1),
                           "max-autotune-no-cudagraphs": Prior((0.26, 0.1), risk=0.1)},
                    addresses=("host", "memory"),
                    fails_with={words: ("reduce-overhead", "max-autotune") for words in (
                        "cuda graph", "cudagraph", "stream is capturing", "stream capture")},
                ),
            ),
            BoolOption(
                "compile_fullgraph",
                False,
                "Fail on any graph break instead of falling back to eager for that part",
                label="Full graph",
                search=SearchFacts(prior={True: Prior((0.0, 0.01))}),
            ),
            ChoiceOption(
                "compile_scope",
                "model",
                "model: one graph for the whole model; block: compile each repeated block "
                "(cheaper to compile; blocks of several shapes are compiled whole)",
                choices=("model", "block"),
                label="Compile scope",
                search=SearchFacts(
                    values=("model", "block"), activations=True,
                    # On the H200, per block against the whole model: GPT-2 124M 0.88x-1.0x by
                    # batch; llama-1b 0.97x-1.01x, with float8 0.99x-1.02x; the HF Llama 1.3B
                    # with float8 and CUDA graphs 0.83x; each compiled in a quarter of the time.
                    prior={"block": Prior((-0.08, 0.05), large=(-0.03, 0.05))},
                ),
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
                search=SearchFacts(
                    values=("plain", "foreach", "fused"), activations=True, in_graph=False,
                    # GPT-2 124M bf16 + compile: fused 1.09x plain, foreach 1.05x.
                    prior={"foreach": Prior((0.04, 0.03)), "fused": Prior((0.07, 0.03))},
                    addresses=("host",),
                ),
            ),
            ChoiceOption(
                "optimizer_state",
                "fp32",
                "AdamW's moments: fp32; bf16; 8bit (torchao AdamW8bit); offload (torchao: state "
                "and step on the CPU)",
                choices=("fp32", "bf16", "8bit", "offload"),
                choice_requires={"offload": ("cuda",)},
                label="Optimizer state",
                search=SearchFacts(
                    values=("fp32", "bf16", "8bit", "offload"), lever="memory", in_graph=False,
                    reference=("fp32", "offload"), numerics={"bf16": "bf16", "8bit": "bf16"},
                    # torch's AdamW (and its implementation flag) steps only fp32 or offloaded
                    # state; torchao's steps the others: moving back, the flag matters again.
                    interacts=("optimizer",),
                    # A 1.3B Llama, autocast + compile: AdamW8bit 0.90x; offload pays only where
                    # nothing else fits.
                    prior={"bf16": Prior((-0.01, 0.02), risk=0.02),
                           "8bit": Prior((-0.06, 0.03), risk=0.03),
                           "offload": Prior((-0.5, 0.2), risk=0.05)},
                    bytes_per_parameter={"fp32": 8, "bf16": 4, "8bit": 2, "offload": 0},
                    costs_only=("offload",),
                ),
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
                search=SearchFacts(
                    # Multiples of the workload's default, doubling on past the last while a
                    # doubling pays and fits (space.CLIMB): the batch the optimizer sees changes
                    # the training, so `--set batch_size=N` holds it.
                    values=("x1", "x2", "x4", "..."), lever="both",
                    # (the compiled graph sees the micro-batch: `search.timing.graph_key`)
                    in_graph=False,
                    # Per doubling of the micro-batch each forward sees: GPT-2 124M compiled,
                    # 16 -> 32 -> 64: +7%, +2%. Per doubling of the micro-batches accumulated
                    # (the same kernels, the optimizer step shared by more samples): GPT-2 124M
                    # compiled, batch 16 -> 32 from micro-batches of 16, -0.2%
                    # (benchmarks/results/h200-2026-12-03/graph-cache); a 1.5B llama, 4 -> 16
                    # from micro-batches of 4, +6.9% (h200-2026-12-04/accumulation). The prior
                    # serves only where the parent's optimizer step was not measured: otherwise
                    # its share of the step predicts the move (`priors.accumulation_move`).
                    prior={"x2": Prior((0.04, 0.04), cpu=(0.0, 0.05)),
                           "x2 accumulated": Prior((0.005, 0.01), cpu=(0.0, 0.01))},
                    addresses=("host",),
                ),
            ),
            IntOption(
                "micro_batch_size",
                0,
                "Sequences per forward/backward, gradients accumulated over batch_size / "
                "micro_batch_size of them (0: the whole batch at once)",
                minimum=0,
                maximum=MAX_BATCH_SIZE,
                label="Micro-batch",
                search=SearchFacts(
                    lever="memory", in_graph=False,
                    # Per halving of the micro-batch (gradient accumulation over more, smaller
                    # launches), measured on the H200 with the batch held: compiled, five pairs
                    # of the search's trials (llama-1b, the HF Llama, GPT-2) -3% to -18%; eager,
                    # bf16 weights + Liger-Kernel on both Llamas, nine calls, 4 -> 2 sequences
                    # -14% to -34% and 2 -> 1 -34% to -50% (benchmarks/results/
                    # h200-2026-12-0[34]/search-*/hand-*-micro*.json).
                    prior={"/2": Prior((-0.25, 0.12), cpu=(-0.02, 0.04),
                                       compiled=(-0.08, 0.06))},
                ),
            ),
        ),
    ),
)

OPTIONS: dict[str, Option] = {o.key: o for s in STRATEGIES for o in s.options}
OPTION_STRATEGY: dict[str, str] = {o.key: s.name for s in STRATEGIES for o in s.options}

SEARCHED: dict[str, tuple] = {k: o.search.values for k, o in OPTIONS.items() if o.search.values}
"""The values `gputune tune` tries by default, per option (from each option's `SearchFacts`)."""

ACTIVATION_KEYS: tuple[str, ...] = tuple(k for k, o in OPTIONS.items() if o.search.activations)
"""The options that change what a sample holds besides parameters, gradients and state."""
OUTSIDE_GRAPH_KEYS: tuple[str, ...] = tuple(k for k, o in OPTIONS.items() if not o.search.in_graph)
"""The options torch.compile's graph does not see (the batch: only through its micro-batch)."""

# The numerics gate's tolerances per class, from the strictest to the loosest: the relative
# difference of the first LOSS_CHECK_STEPS losses from the fp32 eager reference, and (least
# cosine, largest |norm ratio - 1|) of every first-step gradient tensor that is not negligible.
# fp32 differs from the reference only by summation order; tf32 keeps 10 mantissa bits; bf16 7;
# fp8 matmuls 3 (e4m3) or 2 (e5m2). Measured with benchmarks/gradient_calibration.py on the CPU
# (gpt2-tiny, llama-tiny, Hugging Face tiny GPT-2 and Llama; fp32 and bf16; manual and SDPA
# attention, full checkpointing, all fused kernels), the worst tensor seen had cosine 1 - 5e-14
# in fp32 and 0.999985 in bf16 (norm ratios 1 +- 1.3e-7 and 0.006): the bf16 gradient tolerance
# leaves room for a GPU's flash attention and Inductor's kernels. On the H200, clean fp8
# tensorwise runs of a 1.3B HF Llama lost 2.7-3.3% in their losses and had their worst gradient
# at cosine 0.940, norm ratio 0.965. Injected faults land far outside all of these: x2 in a
# backward gives a norm ratio of 2, zeroed gradients a cosine of 0, a wrong sign -1.
NUMERICS: dict[str, tuple[float, tuple[float, float]]] = {
    "fp32": (2e-3, (0.9999, 1e-3)),
    "tf32": (1e-2, (0.999, 0.02)),
    "fp16": (3e-2, (0.995, 0.05)),
    "bf16": (3e-2, (0.98, 0.15)),
    "fp8": (6e-2, (0.85, 0.25)),
}


def numerics_class(values: dict) -> str:
    """The loosest numerics class among a configuration's options (`SearchFacts.numerics`):
    whose tolerances its losses and gradients are held to."""
    order = list(NUMERICS)
    found = "fp32"
    for key, option in OPTIONS.items():
        cls = option.search.numerics.get(_plain_value(values[key]))
        if cls is not None and order.index(cls) > order.index(found):
            found = cls
    return found


def computes_reference(values: dict) -> bool:
    """True where every option is at a value that computes what the fp32 eager reference
    computes (`SearchFacts.reference`): then the configuration's own losses are the reference."""
    return all(option.search.reference is None
               or _plain_value(values[key]) in [_plain_value(v) for v in option.search.reference]
               for key, option in OPTIONS.items())


def _plain_value(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value

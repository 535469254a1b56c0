"""Priors of the memory model, from a transformer's shapes: what a sample holds in activations
and logits under a configuration, and what a step holds once whatever its micro-batch. The
memory model (`memory.py`) uses them only in ratio to a measured trial or as the part that does
not scale with the micro-batch, never as a peak on their own. Torch-free.

Counts are per token and per decoder layer, in elements of an h-sized (hidden), kv-sized
(key/value heads x head size) or i-sized (MLP intermediate) vector, for a Llama-style block
(norm, q/k/v, SDPA, o, norm, gate/up, down); a GPT-2 block is close enough (its MLP is one
up projection of 4h instead of two of i)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from strategies.config import TuneConfig


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    kv_repeated: bool = False
    """The model repeats keys and values to every query head before attention (the built-in
    Llama does; HF's passes grouped heads to SDPA): SDPA keeps the repeated copies, and in fp32
    it needs no math path for grouped heads, which keeps the softmax weights."""
    loss_in_fp32: bool = True
    """The loss takes an fp32 copy of the logits (HF's causal LMs: `logits.float()`); the
    built-in models take it of the logits in their own dtype, which compile fuses away."""

    @property
    def kv(self) -> int:
        """Elements of one token's key (or value) across the key/value heads."""
        return self.hidden // self.heads * self.kv_heads

    def to_dict(self) -> dict:
        d = asdict(self)
        # Written only where they differ from most models, as in the files before the flags.
        if not self.kv_repeated:
            del d["kv_repeated"]
        if self.loss_in_fp32:
            del d["loss_in_fp32"]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "ModelShape | None":
        if not d:
            return None
        try:
            counts = {k: int(d[k]) for k in cls.__dataclass_fields__
                      if k not in ("kv_repeated", "loss_in_fp32")}
        except (KeyError, TypeError, ValueError):
            return None
        return cls(**counts, kv_repeated=bool(d.get("kv_repeated", False)),
                   loss_in_fp32=bool(d.get("loss_in_fp32", True)))


def activation_bytes(config: TuneConfig) -> int:
    """Bytes of one activation element: bf16/fp16 under autocast or bf16 weights, else fp32."""
    return 2 if config.precision in ("bf16", "fp16") or config.weights == "bf16" else 4


def _kept_per_layer(config: TuneConfig, s: ModelShape) -> tuple[float, float]:
    """Elements one token keeps per layer for the backward, as (in activation dtype, in the
    one-byte fp8 copies), with no checkpointing."""
    h, kv, i = s.hidden, s.kv, s.intermediate
    if config.compile_mode != "off":
        # Inductor's partitioner recomputes the norms' statistics and the gate's activation:
        # it keeps the residual stream and the normed inputs of the linears (4h), q, k, v,
        # the attention output (h), gate, up and their product (the down projection's input).
        kept, linear_inputs = 5 * h + 2 * kv + 3 * i, 2 * h + i
    else:
        # Eager keeps every op's inputs: both norms' input and output (4h), q/k/v and their
        # rotated q/k (2h + 3kv), the attention output (h), gate, up, silu(gate), their product;
        # the fused SwiGLU kernel recomputes silu(gate) in its backward instead of keeping it.
        swiglu = "swiglu" in config.effective_kernels()
        kept, linear_inputs = 7 * h + 3 * kv + (3 if swiglu else 4) * i, 2 * h + i
    if s.kv_repeated and kv < h:
        kept += 2 * h  # the repeated keys and values, which SDPA keeps for its backward
    if config.fp8 != "off":
        # float8 training keeps the linears' inputs (the normed hidden twice, the MLP product)
        # as one-byte copies in place of the activation dtype's.
        return kept - linear_inputs, linear_inputs
    return kept, 0


def _selective_per_layer(s: ModelShape) -> float:
    """What selective checkpointing keeps per token and layer: the block input and the outputs
    of matmuls and attention (q, k, v, attention, o, gate, up, down); the norms and the MLP's
    product are recomputed."""
    return 5 * s.hidden + 2 * s.kv + 2 * s.intermediate


def per_sample_bytes(config: TuneConfig, s: ModelShape) -> float:
    """Activations and loss buffers one sample holds at the peak of forward and backward."""
    b = activation_bytes(config)
    kept, fp8 = _kept_per_layer(config, s)
    layer = kept * b + fp8
    scores = 0.0
    if config.attention == "manual":
        # Attention written out keeps its softmax weights (heads x seq per token) for the
        # backward: in fp32, which autocast and HF's eager attention take the softmax in, and
        # under half precision their copy in the compute dtype beside them. On the H200, manual
        # over SDPA: GPT-2 at batch 16 +7.6-10 GiB in fp32 (9.0 counted) and +14.7 in bf16
        # (13.5), the 1.3B Llama at batch 4 in fp32 +38 GiB (32); left out, a search took an
        # out-of-memory baseline for one that needed what SDPA needs.
        scores = s.heads * s.seq_len * (4 if b == 4 else 4 + b)
        layer += scores
    if config.checkpointing == "selective":
        # (the attention's scores are a matmul's output, which selective checkpointing keeps)
        layer = min(layer, _selective_per_layer(s) * b + scores * b / 4)
    elif config.checkpointing in ("full", "every-n"):
        every = config.checkpoint_every if config.checkpointing == "every-n" else 1
        # A checkpointed block keeps its input; one block at a time is recomputed whole.
        checkpointed = s.layers // every
        per_token = (s.layers - checkpointed) * layer + checkpointed * s.hidden * b + layer
        return s.seq_len * (per_token + _head_per_token(config, s, b))
    if b == 4 and s.kv_heads < s.heads and not s.kv_repeated and config.attention == "sdpa":
        # SDPA's fused kernels need half precision for grouped-query attention: fp32 takes the
        # math path, which keeps the softmax weights (heads x seq per token) for the backward.
        layer += s.heads * s.seq_len * 4
    return s.seq_len * (s.layers * layer + _head_per_token(config, s, b))


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The compile modes that replay CUDA graphs."""


def _head_per_token(config: TuneConfig, s: ModelShape, b: int) -> float:
    """The logits in the activation dtype, and beside them the fp32 copy the loss takes (HF's
    `logits.float()`) or, in the built-in models' eager loss, its fp32 buffers; under compile
    the built-in models' loss fuses into one kernel that keeps only the logits (on the H200 the
    fused loss saved llama-1b 0.3-0.5 GB under compile, the HF Llama 6.6 GB). The fused
    linear + cross-entropy never holds them whole."""
    if "linear_cross_entropy" in config.effective_kernels():
        return 0
    if config.compile_mode == "off" and not s.loss_in_fp32:
        # The built-in models' loss in eager runs in fp32 whatever the precision (autocast's
        # policy for log-softmax and NLL): beside the logits, the log-softmax it keeps and, in
        # the backward, one fp32 gradient at a time. (On the H200, GPT-2 at batch 16 held 9
        # bytes a logit allocated and 12 reserved; counting two in the logits' dtype had put its
        # fused loss 49% over.)
        return s.vocab * (b + 8)
    if config.compile_mode == "off":
        # HF's in eager: the logits, the log-softmax of their fp32 copy and, fitted to the
        # committed HF files (`memory_replay`), 2 bytes more than under compile; 4 more put
        # its two-GPU FSDP2 rows 18% under, none put its fully checkpointed fp32 reference 19%
        # under.
        return s.vocab * (b + 6)
    if s.loss_in_fp32 or config.compile_mode in CUDA_GRAPH_MODES:
        # A CUDA graph's private pool keeps the loss's intermediates too (GPT-2 at batch 64
        # under reduce-overhead held its logits at 6 bytes an element, as HF's loss does).
        return s.vocab * (b + 4)
    return s.vocab * b


def shards(config: TuneConfig) -> int:
    """Into how many parts parameters, gradients and optimizer state are split: the devices
    under FSDP2; 1 where every rank holds them whole (DDP, one device)."""
    return config.devices if config.parallel == "fsdp2" else 1


def autocast_copy_bytes(config: TuneConfig, n_params: int) -> float:
    """Autocast's half-precision copies of fp32 weights, kept from the forward through the
    backward beside the activations, whatever the micro-batch. Under compile the partitioner
    keeps them only where nothing recomputes the forward's casts: with checkpointing it casts
    again in the backward (counting the copies put a selectively checkpointed HF Llama 20%
    over), and float8 training casts the linears' weights itself. On the H200, selective
    checkpointing and fp8 each saved 2-3 GB more on fp32 weights than on bf16 weights, the
    linears' bf16 copies. (FSDP2 gathers each block's parameters in the compute dtype instead,
    a block at a time.)"""
    if config.weights != "fp32" or config.precision not in ("bf16", "fp16") or shards(config) > 1:
        return 0.0
    if config.compile_mode != "off" and (config.checkpointing != "off" or config.fp8 != "off"):
        return 0.0
    return 2 * n_params


def optimizer_copy_bytes(config: TuneConfig, s: ModelShape) -> float:
    """The optimizer step's fp32 working copies of the largest matrix (the embedding or LM
    head: parameter, gradient and two moments) where torchao's AdamW upcasts per tensor (bf16
    weights, bf16 or 8-bit state), on this device's shard. The step runs after the backward has
    freed the activations and autocast's copies, so these do not add to them: a step's peak is
    the larger of the two (on the H200, adding them put the estimate of an HF Llama 23% over)."""
    if config.weights == "bf16" or config.optimizer_state in ("bf16", "8bit"):
        return 4 * 4 * s.vocab * s.hidden / shards(config)
    return 0.0

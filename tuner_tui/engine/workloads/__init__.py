"""Workloads: what gets trained. Built-in GPT-2- and Llama-style models, models named by a
kind (`hf:PATH`, `torchvision:NAME`, `timm:NAME`: `tuner_tui.engine.workload_kinds`), or a
user's own.

A user's workload is `package.module:function`. The function may take any of the keyword
arguments `device` ("cuda" or "cpu"), `seed`, `seq_len` and `data` (the --data path), and
returns a `Workload`. See examples/ for Hugging Face, vision and hand-written models. What it
returns is checked (`check`), and its code identifies it (`code_identity`): results stored for
one version of a user's model are never reused for another.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from tuner_tui.engine.workloads.errors import WorkloadError  # noqa: F401  (raised here, imported from here)
from strategies.registry import MAX_BATCH_SIZE
from tuner_tui.engine.workloads import gpt, llama
from tuner_tui.engine.workloads.data import SyntheticTokens, TextFileTokens

MAX_ITEMS_PER_SAMPLE = 2**31
"""Items (tokens) per sample: far above any sequence that fits a machine, low enough that a
typo cannot overflow the throughput arithmetic."""


def default_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW as GPT-2 reproductions train it: weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=False)


@dataclass
class Workload:
    """Everything the trainer needs. `batch(step, batch_size, device)` must return the same
    batch for the same arguments; `loss(model, batch)` returns a scalar tensor."""

    name: str
    build_model: Callable[[], nn.Module]
    batch: Callable[[int, int, torch.device], tuple]
    items_per_sample: int
    """Tokens per sequence for language models (throughput is reported per item)."""
    default_batch_size: int
    loss: Callable[[nn.Module, tuple], torch.Tensor] = field(
        default=lambda model, batch: model(*batch)
    )
    flops_per_item: Callable[[nn.Module], float] | None = None
    """Training FLOPs per item (6N + attention for transformers), for MFU; None: no MFU."""
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] = default_optimizer
    item_name: str = "tokens"
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    """The model's repeated blocks, for checkpointing and per-block compile; None: found
    automatically (the largest list of same-type modules)."""
    code: str = ""
    """What identifies a user's workload beyond its name: its function's qualified name and a
    hash of its source files (`code_identity`), set by `load`. Empty for the built-in models,
    whose code is part of gputune's code hash."""
    _facts: tuple[dict[str, str], dict[str, str]] | None = field(
        default=None, init=False, repr=False, compare=False)

    def inapplicable(self) -> dict[str, str]:
        """The options and choices that change nothing in this model, each with the reason
        (`strategies.compose.inapplicable`)."""
        return self._model_facts()[0]

    def changes_training(self) -> dict[str, str]:
        """The options that would train this model differently beyond rounding, each with the
        reason (`strategies.compose.changes_training`: micro-batches under BatchNorm)."""
        return self._model_facts()[1]

    def _model_facts(self) -> tuple[dict[str, str], dict[str, str]]:
        """Found once, on a copy built on the meta device (no memory, no compute); empty where
        the model cannot be built there."""
        if self._facts is None:
            from strategies.compose import changes_training, inapplicable

            try:
                with torch.device("meta"):
                    model = self.build_model()
                    blocks = self.blocks(model) if self.blocks else None
                self._facts = (inapplicable(model, blocks), changes_training(model, blocks))
            except Exception:  # a user's model may not build without real tensors: assume all apply
                self._facts = ({}, {})
        return self._facts

    def describe(self, model: nn.Module | None = None) -> dict:
        d = {
            "name": self.name,
            "items_per_sample": self.items_per_sample,
            "item_name": self.item_name,
            "default_batch_size": self.default_batch_size,
            "inapplicable": dict(self.inapplicable()),
            "changes_training": dict(self.changes_training()),
        }
        if self.code:
            d["code"] = self.code
        if model is not None:
            d["parameters"] = sum(p.numel() for p in model.parameters())
        return d


def check(workload: Workload, name: str) -> None:
    """WorkloadError naming the field and what is allowed, for a Workload that would train
    nonsense (a negative item count gives negative throughput; a batch of 0 looks diverged)."""
    def refuse(field_name: str, value, allowed: str) -> None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise WorkloadError(f"workload {name!r}: {field_name} = {shown} is not allowed: {allowed}")

    for field_name, low, high in (("items_per_sample", 1, MAX_ITEMS_PER_SAMPLE),
                                  ("default_batch_size", 1, MAX_BATCH_SIZE)):
        value = getattr(workload, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            refuse(field_name, value, f"an integer from {low} to {high}")
    for field_name in ("name", "item_name"):
        value = getattr(workload, field_name)
        if not isinstance(value, str) or not value.strip() or len(value) > 200:
            refuse(field_name, value, "a non-empty string")
    for field_name in ("build_model", "batch", "loss", "make_optimizer"):
        if not callable(getattr(workload, field_name)):
            refuse(field_name, getattr(workload, field_name), "a function")
    for field_name in ("flops_per_item", "blocks"):
        value = getattr(workload, field_name)
        if value is not None and not callable(value):
            refuse(field_name, value, "a function or None")


def code_identity(func: Callable, module) -> str:
    """`module.qualname@hash`: the function's qualified name and a SHA-256 of the files of its
    module and of the module that defines it (they differ when it is imported from another)."""
    qualname = getattr(func, "__qualname__", type(func).__qualname__)
    defined_in = getattr(func, "__module__", None) or module.__name__
    files = {getattr(module, "__file__", None)}
    code = getattr(func, "__code__", None)
    files.add(getattr(code, "co_filename", None))
    digest = hashlib.sha256()
    for name in sorted(f for f in files if f):
        digest.update(name.encode() + b"\0")
        try:
            digest.update(Path(name).read_bytes())
        except OSError:  # no source file (a frozen or built-in module): its name stands in
            pass
    return f"{defined_in}.{qualname}@{digest.hexdigest()[:16]}"


def _checked_build(build: Callable[[], nn.Module], name: str) -> Callable[[], nn.Module]:
    """`build`, refusing with one line a result that is not a torch module."""
    def build_model() -> nn.Module:
        model = build()
        if not isinstance(model, nn.Module):
            raise WorkloadError(f"workload {name!r}: build_model returned {type(model).__name__}; "
                                "expected a torch.nn.Module")
        return model

    return build_model


def device_memory_bytes(device: str) -> int:
    """The memory a run on `device` can have at most: the GPU's, or the machine's RAM."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    import psutil

    return psutil.virtual_memory().total


def check_sequence_fits(name: str, seq: int, vocab_size: int, device: str) -> None:
    """WorkloadError when one sequence's fp32 logits alone exceed the device's memory: such a
    --seq-len can only end in an out-of-memory kill, so it is refused with the largest that
    could fit."""
    per_token = vocab_size * 4
    memory = device_memory_bytes(device)
    if seq * per_token > memory:
        gib = 1024**3
        raise WorkloadError(
            f"--seq-len {seq} is too long for {name} here: one sequence's logits alone take "
            f"{seq * per_token / gib:.1f} GiB ({seq} tokens x {vocab_size} vocabulary x 4 bytes), "
            f"more than the {memory / gib:.1f} GiB of {device} memory; allowed here: up to "
            f"{memory // per_token}, far less in practice")


GPT_SHAPES = {
    "gpt2-tiny": (gpt.GPTShape(n_layer=2, n_head=2, n_embd=64, vocab_size=512, block_size=64), 8),
    "gpt2-124m": (gpt.GPTShape(n_layer=12, n_head=12, n_embd=768), 16),
    "gpt2-350m": (gpt.GPTShape(n_layer=24, n_head=16, n_embd=1024), 8),
}
LLAMA_SHAPES = {
    "llama-tiny": (
        llama.LlamaShape(
            n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=176, vocab_size=512,
            block_size=64,
        ),
        8,
    ),
    # The shape of Llama 3.2 1B (untied head, so ~1.5B parameters).
    "llama-1b": (
        llama.LlamaShape(
            n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192,
            vocab_size=128256, block_size=2048, rope_theta=500000.0,
        ),
        4,
    ),
}
BUILTIN = tuple(GPT_SHAPES) + tuple(LLAMA_SHAPES)


def _non_embedding_params(model: nn.Module) -> int:
    skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def builtin(name: str, seq_len: int | None, seed: int, data: str | None,
            device: str = "cpu") -> Workload:
    if name in GPT_SHAPES:
        shape, batch = GPT_SHAPES[name]
        module, cls = gpt, gpt.GPT
    else:
        shape, batch = LLAMA_SHAPES[name]
        module, cls = llama, llama.Llama
    seq = seq_len or shape.block_size
    if seq > shape.block_size and name in GPT_SHAPES:
        raise WorkloadError(f"--seq-len {seq} is longer than {name}'s context of {shape.block_size}")
    check_sequence_fits(name, seq, shape.vocab_size, device)
    source = (
        TextFileTokens(data, seq, seed) if data else SyntheticTokens(shape.vocab_size, seq, seed)
    )

    def flops(model: nn.Module) -> float:
        # Count each weight matrix once (tied embeddings are one matrix); the input embedding
        # lookups are not matmuls, but the output head is: use all non-embedding params plus
        # the head when untied (nanoGPT's convention counts the tied matrix once).
        n = _non_embedding_params(model)
        if name in GPT_SHAPES:
            n += shape.vocab_size * shape.n_embd
        return module.flops_per_token(shape, n, seq)

    return Workload(
        name=name,
        build_model=lambda: cls(shape),
        batch=source.batch,
        items_per_sample=seq,
        default_batch_size=batch,
        flops_per_item=flops,
    )


def load(
    name: str, seq_len: int | None = None, seed: int = 0, data: str | None = None,
    device: str = "cpu",
) -> Workload:
    """A built-in workload by name, one of a kind (`hf:PATH`, `torchvision:NAME`, `timm:NAME`:
    `tuner_tui.engine.workload_kinds`), or a user's `module:function`, checked (`check`)."""
    from tuner_tui.engine import workload_kinds

    if name in BUILTIN:
        workload = builtin(name, seq_len, seed, data, device)
        check(workload, name)
        return workload
    if workload_kinds.kind_of(name):
        workload = workload_kinds.build(name, seq_len, seed, data, device)
        check(workload, name)
        return workload
    if ":" not in name:
        kinds = ", ".join(f"{k}:..." for k in workload_kinds.KINDS)
        raise WorkloadError(
            f"unknown workload {name!r}: allowed are {', '.join(BUILTIN)}, {kinds}, or "
            "module:function"
        )
    module_name, _, func_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # the user's module may fail in any way
        raise WorkloadError(
            f"workload {name!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        own = sorted(n for n, f in vars(module).items() if inspect.isfunction(f)
                     and not n.startswith("_") and f.__module__ == module.__name__)
        raise WorkloadError(f"workload {name!r}: {module_name} has no function {func_name!r}; "
                            f"its functions: {', '.join(own) or 'none'}")
    params = inspect.signature(func).parameters
    offered = {"seed": seed, "seq_len": seq_len, "data": data, "device": device}
    kwargs = {k: v for k, v in offered.items() if k in params}
    try:
        result = func(**kwargs)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        raise WorkloadError(f"workload {name!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(result, Workload):
        raise WorkloadError(
            f"workload {name!r} returned {type(result).__name__}; expected "
            "tuner_tui.engine.workloads.Workload"
        )
    check(result, name)
    result.build_model = _checked_build(result.build_model, name)
    result.code = code_identity(func, module)
    return result


def check_first_batch(workload: Workload, name: str, device: str) -> None:
    """The first batch at the default batch size, drawn once: a `batch` that fails or returns
    nothing is one line before any trial."""
    try:
        batch = workload.batch(0, workload.default_batch_size, torch.device(device))
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        detail = (str(exc).splitlines() or [""])[0]
        raise WorkloadError(f"workload {name!r}: its batch(0, {workload.default_batch_size}, "
                            f"{device}) raised {type(exc).__name__}: {detail}") from None
    if batch is None:
        raise WorkloadError(f"workload {name!r}: its batch(0, {workload.default_batch_size}, "
                            f"{device}) returned None; expected the inputs its loss takes, "
                            "e.g. a tuple of tensors")


def resolve_name(name: str, device: str) -> str:
    if name == "auto":
        return "gpt2-124m" if device == "cuda" else "gpt2-tiny"
    return name

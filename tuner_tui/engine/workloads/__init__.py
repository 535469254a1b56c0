"""Workloads: what gets trained. Built-in GPT-2- and Llama-style models, models named by a
kind (`hf:PATH`, `torchvision:NAME`, `timm:NAME`: `tuner_tui.engine.workload_kinds`), or a
user's own.

A user's workload is `package.module:function`. The function may take any of the keyword
arguments `device` ("cuda" or "cpu"), `seed`, `seq_len` and `data` (the --data path), and
returns a `Workload`. See examples/ for Hugging Face, vision and hand-written models.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from tuner_tui.engine.workloads import gpt, llama
from tuner_tui.engine.workloads.data import SyntheticTokens, TextFileTokens


class WorkloadError(ValueError):
    """A workload that cannot be built; the message is one line for the user."""


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
    _inapplicable: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    def inapplicable(self) -> dict[str, str]:
        """The options and choices that change nothing in this model, each with the reason
        (`strategies.compose.inapplicable`). Found once, on a copy built on the meta device (no
        memory, no compute); {} where the model cannot be built there."""
        if self._inapplicable is None:
            from strategies.compose import inapplicable

            try:
                with torch.device("meta"):
                    model = self.build_model()
                    blocks = self.blocks(model) if self.blocks else None
                self._inapplicable = inapplicable(model, blocks)
            except Exception:  # a user's model may not build without real tensors: assume all apply
                self._inapplicable = {}
        return self._inapplicable

    def describe(self, model: nn.Module | None = None) -> dict:
        d = {
            "name": self.name,
            "items_per_sample": self.items_per_sample,
            "item_name": self.item_name,
            "default_batch_size": self.default_batch_size,
            "inapplicable": dict(self.inapplicable()),
        }
        if model is not None:
            d["parameters"] = sum(p.numel() for p in model.parameters())
        return d


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


def builtin(name: str, seq_len: int | None, seed: int, data: str | None) -> Workload:
    if name in GPT_SHAPES:
        shape, batch = GPT_SHAPES[name]
        module, cls = gpt, gpt.GPT
    else:
        shape, batch = LLAMA_SHAPES[name]
        module, cls = llama, llama.Llama
    seq = seq_len or shape.block_size
    if seq > shape.block_size and name in GPT_SHAPES:
        raise WorkloadError(f"--seq-len {seq} is longer than {name}'s context of {shape.block_size}")
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
    `tuner_tui.engine.workload_kinds`), or a user's `module:function`."""
    from tuner_tui.engine import workload_kinds

    if name in BUILTIN:
        return builtin(name, seq_len, seed, data)
    if workload_kinds.kind_of(name):
        return workload_kinds.build(name, seq_len, seed, data, device)
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
        raise WorkloadError(f"workload {name!r}: {module_name} has no function {func_name!r}")
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
    return result


def resolve_name(name: str, device: str) -> str:
    if name == "auto":
        return "gpt2-124m" if device == "cuda" else "gpt2-tiny"
    return name

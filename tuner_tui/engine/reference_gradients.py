"""The fp32 reference's first-step gradients, computed in a trial's own worker process, for the
gradient gate (`gradients.compare`). Apart from the comparison because it builds a `Trainer`,
which itself runs the comparison."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import torch

from strategies.config import TuneConfig
from strategies.files import write_atomic
from tuner_tui.engine.gradients import (WOBBLE_NOISE, load_sketch, save_sketch, sketch_model,
                                        with_wobble)
from tuner_tui.engine.reference_cache import GRADIENTS, LOSS_SPREAD

RANDOM_DRAWS = 5
"""Forwards of the reference's first batch, with the same weights, whose losses tell how far the
model's own randomness (dropout) moves a loss: 0 where it has none, and then no more are run."""
RANDOM_BACKWARDS = 4
"""Where the model has its own randomness, the gradients' wobble is the widest over this many
backward passes, each on other masks: one draw can land close to the reference and leave the gate
a tolerance that the next draw (a candidate's) misses 4x over (an encoder's bias, dropout 0.1).
A deterministic model runs one, as before."""
ARITHMETIC_SPREAD = 1e-6
"""A loss spread below this is arithmetic's own (a GPU kernel's order of additions), not the
model's randomness: counted as none."""

def _micro_batches(batch, parts: int) -> list | None:
    """`batch` split into `parts` along the first dimension, or None when it cannot be (a batch
    that is not tensors, or whose rows do not divide evenly)."""
    if parts == 1:
        return [batch]
    tensors = batch if isinstance(batch, (tuple, list)) else None
    if tensors is None or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
        return None
    rows = tensors[0].shape[0]
    if rows % parts or any(t.shape[0] != rows for t in tensors):
        return None
    return list(zip(*(t.chunk(parts) for t in tensors)))


def reference_gradients(workload, batch_size: int, seed: int, device: str,
                        grad_clip: float = 0.0) -> dict | None:
    """The sketch of the reference's first-step gradients (`reference_check`'s first part)."""
    found = reference_check(workload, batch_size, seed, device, grad_clip)
    return found[0] if found is not None else None


def _silent(part: str) -> None:
    pass


def reference_check(workload, batch_size: int, seed: int, device: str,
                    grad_clip: float = 0.0, on_part: Callable[[str], None] = _silent
                    ) -> tuple[dict, float] | None:
    """The sketch of the fp32 eager reference's gradients after the first backward pass
    (`gradients.sketch`), each tensor with how far rounding-sized noise moves it (`wobble`), and
    how far the model's own randomness moves its first loss (`loss_spread`).

    Where the plain reference runs out of memory: full checkpointing, then the batch in 2, 4, 8
    micro-batches (the mean of equal micro-batch means is the batch mean; not for a model that
    micro-batches would train differently, `Workload.changes_training`), so that it fits
    wherever the candidate does. None when even that does not fit. `on_part` is told of each
    forward and backward done ("forward", "backward"): these passes of a large model on a slow
    device take minutes, and the trial must not look hung meanwhile."""
    from tuner_tui.engine.trial import classify, release_memory

    plain = TuneConfig.reference(batch_size).replace(grad_clip=grad_clip)
    splits = (1,) if "micro_batch_size" in workload.changes_training() else (1, 2, 4, 8)
    attempts = [(plain, 1)] + [(plain.replace(checkpointing="full"), n) for n in splits]
    try:
        for config, parts in attempts:
            try:
                grads = _attempt(workload, config, parts, seed, device, on_part)
            except Exception as exc:
                if classify(exc) != "oom":
                    raise
                continue
            if grads is not None:
                return grads
        return None
    finally:
        # A failed attempt's model and graph die with its frame; the blocks they held stay in
        # this process's cache until emptied, out of reach of the next process (a group's rank 0
        # shares this GPU: seen on the H200, where they held all 139 GiB of it).
        release_memory()


def _attempt(workload, config: TuneConfig, parts: int, seed: int, device: str,
             on_part: Callable[[str], None]):
    """One try at the reference gradients, in its own frame: when it runs out of memory, its
    model, batch and half-built graph go with the frame instead of lingering (as locals of a
    loop) while the next, smaller try is built."""
    from tuner_tui.engine.trial import Trainer

    trainer = Trainer(workload=workload, config=config, device=device, seed=seed)
    try:
        trainer.build()
        batch = workload.batch(0, trainer.batch_size, trainer.torch_device)
        micro = _micro_batches(batch, parts)
        if micro is None:
            return None
        model = trainer.tuned.model

        def backward() -> None:
            for part in micro:
                loss = workload.loss(model, tuple(part) if parts > 1 else part)
                on_part("forward")
                (loss / parts).backward()
                on_part("backward")

        backward()
        clean = sketch_model(model)
        spread = loss_spread(workload, model, micro, parts, on_part)
        # Once more with every parameter nudged by rounding-sized noise: how far rounding alone
        # moves each gradient (what the candidate's own rounding may move it, too).
        model.zero_grad(set_to_none=True)
        generator = torch.Generator(device=trainer.torch_device).manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
                p.mul_(1 + WOBBLE_NOISE * noise)
        backward()
        wobbled = with_wobble(clean, sketch_model(model))
        for _ in range(RANDOM_BACKWARDS - 1 if spread > 0 else 0):
            model.zero_grad(set_to_none=True)
            backward()
            wobbled = _widest(wobbled, with_wobble(clean, sketch_model(model)))
        return wobbled, spread
    finally:
        trainer.close()


def _widest(a: dict, b: dict) -> dict:
    """Per tensor, the larger of two wobbles (direction and norm) around the same clean sketch."""
    return {name: dataclasses.replace(s, wobble=max(s.wobble, b[name].wobble),
                                      wobble_ratio=max(s.wobble_ratio, b[name].wobble_ratio))
            if name in b else s for name, s in a.items()}


def loss_spread(workload, model, micro: list, parts: int,
                on_part: Callable[[str], None] = _silent) -> float:
    """How far the model's own randomness moves the first batch's loss, relative to it: the
    largest change over RANDOM_DRAWS forwards of the same weights (0 for a deterministic model,
    after one). A compiled or micro-batched run draws other dropout masks than the eager
    reference, so its losses differ by about this much whatever its numerics (an encoder with
    dropout 0.1 on the CPU: 0.1-0.4% a draw, its compiled and micro-batched runs 0.4-0.6% over 8
    steps, against fp32's 0.2%)."""
    def loss() -> float:
        total = 0.0
        for part in micro:
            total += float(workload.loss(model, tuple(part) if parts > 1 else part))
            on_part("forward")
        return total / parts

    with torch.no_grad():
        first = loss()
        if not first:
            return 0.0
        changes = []
        for _ in range(RANDOM_DRAWS):
            changes.append(abs(loss() - first) / abs(first))
            if changes[0] < ARITHMETIC_SPREAD:
                return 0.0
    return max(changes)


def read_cached(entry: str | Path) -> tuple[dict, float | None] | None:
    """The sketch of the reference's gradients and its loss spread from a reference cache entry
    (`reference_cache.ReferenceCache.entry`) a worker wrote before; None where it holds none."""
    path = Path(entry) / GRADIENTS
    sketched = load_sketch(path) if path.exists() else None
    if sketched is None:
        return None
    return sketched, _read_spread(path.parent / LOSS_SPREAD)


def write_cached(entry: str | Path, sketched: dict, spread: float | None) -> None:
    """Keep them in the entry for the workers to come (raises where it cannot be written)."""
    folder = Path(entry)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / LOSS_SPREAD, json.dumps(spread))
    save_sketch(folder / GRADIENTS, sketched)


def _read_spread(path: Path) -> float | None:
    """The loss spread written beside a cached reference's gradients; None where there is none
    (a cache entry written before it was kept) or it cannot be read."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

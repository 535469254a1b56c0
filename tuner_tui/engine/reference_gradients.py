"""The fp32 reference's first-step gradients, computed in a trial's own worker process, for the
gradient gate (`gradients.compare`). Apart from the comparison because it builds a `Trainer`,
which itself runs the comparison."""

from __future__ import annotations

import torch

from strategies.config import TuneConfig
from tuner_tui.engine.gradients import WOBBLE_NOISE, sketch_model, with_wobble

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
    """The sketch of the fp32 eager reference's gradients after the first backward pass
    (`gradients.sketch`), each tensor with how far rounding-sized noise moves it (`wobble`).

    Where the plain reference runs out of memory: full checkpointing, then the batch in 2, 4, 8
    micro-batches (the mean of equal micro-batch means is the batch mean), so that it fits
    wherever the candidate does. None when even that does not fit."""
    from tuner_tui.engine.trial import classify, release_memory

    plain = TuneConfig.reference(batch_size).replace(grad_clip=grad_clip)
    attempts = [(plain, 1)] + [(plain.replace(checkpointing="full"), n) for n in (1, 2, 4, 8)]
    try:
        for config, parts in attempts:
            try:
                grads = _attempt(workload, config, parts, seed, device)
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


def _attempt(workload, config: TuneConfig, parts: int, seed: int, device: str):
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
                (loss / parts).backward()

        backward()
        clean = sketch_model(model)
        # Once more with every parameter nudged by rounding-sized noise: how far rounding alone
        # moves each gradient (what the candidate's own rounding may move it, too).
        model.zero_grad(set_to_none=True)
        generator = torch.Generator(device=trainer.torch_device).manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
                p.mul_(1 + WOBBLE_NOISE * noise)
        backward()
        return with_wobble(clean, sketch_model(model))
    finally:
        trainer.close()

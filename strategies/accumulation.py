"""Gradient accumulation (micro_batch_size) and the models whose training it changes.

Micro-batches accumulated give the whole batch's gradient only where a sample's loss does not
depend on the other samples beside it. A BatchNorm in training mode normalizes by the
statistics of the batch it is fed: given micro-batches, by each micro-batch's, so the step is
another one than the whole batch's, and the gradient gate refuses it (a small ResNet, micro-
batches of 4 of 16: first-step gradients at cosine 0.96 against fp32's 0.9999). The search
leaves micro-batches out for such a model (`changes_training`); bench still measures them
where asked, and names the cause beside the refusal.
"""

from __future__ import annotations

from torch import nn


def changes_training(model: nn.Module, blocks) -> dict[str, str]:
    """{"micro_batch_size": why} where the model normalizes by batch statistics, else {}."""
    norms = sum(1 for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    if not norms:
        return {}
    layers = "BatchNorm layer" if norms == 1 else f"{norms} BatchNorm layers"
    return {"micro_batch_size": f"its {layers} would normalize each micro-batch by its own "
                                "statistics, not the whole batch's"}

"""Attention implementation: manual (matmul + masked softmax) or torch's SDPA.

Applies to modules that expose an `attention_impl` attribute (gputune's built-in models, or a
user's module that follows the same convention); others are left alone and counted as such.
With `sdpa`, Hugging Face models that already attend with SDPA also stop materializing the
causal mask when no padding mask is passed (`strategies.hf_attention`).
"""

from __future__ import annotations


def inapplicable(model, blocks) -> dict[str, str]:
    """`attention` where nothing in the model takes it: no module with `attention_impl` and no
    Hugging Face model attending with SDPA (a CNN, an MLP, a model with its own attention)."""
    from strategies import hf_attention

    if any(hasattr(m, "attention_impl") for m in model.modules()) or hf_attention.hf_sdpa_models(model):
        return {}
    return {"attention": "no attention module that gputune switches"}


def apply(run, config) -> None:
    switched = 0
    for module in run.model.modules():
        if hasattr(module, "attention_impl"):
            module.attention_impl = config.attention
            switched += 1
    run.report["attention"] = {"modules": switched, "impl": config.attention}
    if config.attention == "sdpa":
        from strategies import hf_attention

        run.report["attention"].update(hf_attention.switch(run.model))

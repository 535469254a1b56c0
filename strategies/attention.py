"""Attention implementation: manual (matmul + masked softmax) or torch's SDPA.

Applies to modules that expose an `attention_impl` attribute (gputune's built-in models, or a
user's module that follows the same convention); others are left alone and counted as such.
With `sdpa`, Hugging Face models that already attend with SDPA also stop materializing the
causal mask when no padding mask is passed (`strategies.hf_attention`).
"""

from __future__ import annotations


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

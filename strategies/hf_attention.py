"""SDPA in Hugging Face models without a materialized causal mask, under compile too.

A Hugging Face model with `attn_implementation="sdpa"` hands SDPA `is_causal=True` and no mask
only when it can see that the mask is the plain causal one. Under torch.compile it cannot: the
positions it makes itself might be packed sequences, and it may not read tensor values while
tracing. So it builds a (batch, 1, seq, seq) boolean mask and SDPA runs its masked kernel, every
block of the square computed and the upper half thrown away: attention took 3x as long in a
compiled 1.3B Llama on an H200 as in the same model eager.

gputune knows more than the traced code: a call that passes no `attention_mask`, no
`position_ids` and no cache gets positions 0..n-1 for every sequence, so its mask is the plain
causal one. Such calls get a keyword, `gputune_causal=True`, which Hugging Face's models pass
down to their attention function; the attention is switched to `gputune_sdpa`, Hugging Face's
own SDPA attention that drops the mask (SDPA then takes `is_causal=True`) when that keyword is
set, the layer is causal, has no sliding window and has as many queries as keys. In every other
call the mask is used as before. The mask that is built and then unused is removed by Inductor
under compile. Registered through transformers' public `AttentionInterface`; the user's code and
the model's classes are untouched (the forward of each switched model instance is wrapped).
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

NAME = "gputune_sdpa"
KEYWORD = "gputune_causal"
# Arguments whose presence means the mask may be more than the plain causal one.
_MASK_INPUTS = ("attention_mask", "position_ids", "past_key_values", "cache", "cache_position")


@functools.cache
def register() -> str | None:
    """Register `gputune_sdpa` with transformers; None, or why it cannot be."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        return f"this transformers has no attention interfaces ({e})"
    sdpa_attention = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, **kwargs):
        plain_causal = (
            kwargs.pop(KEYWORD, False)
            and getattr(module, "is_causal", True)
            and kwargs.get("sliding_window") is None
            and query.shape[2] == key.shape[2] > 1
        )
        return sdpa_attention(module, query, key, value,
                              None if plain_causal else attention_mask, **kwargs)

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return None


def hf_sdpa_models(model: nn.Module) -> list[nn.Module]:
    """The Hugging Face models in `model` (itself or its children) that attend with SDPA, or
    with `gputune_sdpa` already: `set_attn_implementation` changes the model's config, which
    the models built later from the same config object share."""
    return [
        m for m in model.modules()
        if getattr(getattr(m, "config", None), "_attn_implementation", None) in ("sdpa", NAME)
        and hasattr(m, "set_attn_implementation")
    ]


def _takes_any_keyword(module: nn.Module) -> bool:
    return any(p.kind is p.VAR_KEYWORD
               for p in inspect.signature(module.forward).parameters.values())


def _mark_plain_causal_calls(model: nn.Module) -> None:
    """Wrap `model.forward` (an instance attribute) so that calls without a mask, positions or
    cache carry `gputune_causal=True` down to the attention."""
    original = model.forward
    # Positional arguments mapped to names once: inspect inside the wrapper would break
    # torch.compile's graph.
    positional = [
        p.name for p in inspect.signature(original).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]

    if getattr(original, "gputune_causal_calls", False):
        return

    @functools.wraps(original)
    def forward(*args, **kwargs):
        given = dict(zip(positional, args))
        if all(kwargs.get(k) is None and given.get(k) is None for k in _MASK_INPUTS):
            kwargs.setdefault(KEYWORD, True)
        return original(*args, **kwargs)

    forward.gputune_causal_calls = True  # (functools.wraps keeps other wrappers' marks)
    model.forward = forward


def switch(model: nn.Module) -> dict:
    """Switch the SDPA attention of every Hugging Face model in `model` to `gputune_sdpa`;
    what the report adds ({} where there is none)."""
    models = [m for m in hf_sdpa_models(model) if _takes_any_keyword(m)]
    if not models:
        return {}
    why_not = register()
    if why_not is not None:
        return {"hf_models": 0, "hf_left": len(models), "hf_reason": why_not}
    for m in models:
        if m.config._attn_implementation != NAME:
            m.set_attn_implementation(NAME)
        _mark_plain_causal_calls(m)
    return {"hf_models": len(models),
            "hf_causal_mask": "not materialized for calls without a mask, positions or cache"}

"""The loss of Hugging Face causal LMs as gputune's fused linear + cross-entropy.

A Hugging Face causal LM called with `labels=` builds the full (batch, seq, vocab) logits, upcasts
them to fp32 and takes the cross-entropy: on a 128k vocabulary that is the largest tensor of
the step. Here the model's `forward` is wrapped: with labels, it runs the decoder (the base
model that `get_decoder()` or `base_model` returns) and computes the loss from the final hidden
states and `lm_head.weight` with `gputune_kernels.fused_linear_cross_entropy`, chunk by chunk, with
Hugging Face's label shift and ignore_index = -100; the output carries `.loss` and no logits.
Without labels (generation, evaluation of logits) the model's own forward runs. The user's
code keeps calling `model(input_ids, labels=...)` and reading `.loss`.

Recognised generically: a module whose output embedding (`get_output_embeddings()`, else an
`lm_head`) is an `nn.Linear`, a decoder from `get_decoder()` (or `base_model`) other than itself,
and a forward that takes `labels` (Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, whose head
transformers 4 names `embed_out`, and the like). Models whose logits are changed between
the head and the loss (Gemma 2's soft-capping, Cohere's logit scale) are left alone.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

IGNORE_INDEX = -100
# Arguments of the causal LM's forward that its decoder does not take.
_HEAD_ONLY = ("labels", "logits_to_keep", "num_items_in_batch", "shift_labels", "return_dict")


def decoder_of(model: nn.Module) -> nn.Module | None:
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if not isinstance(decoder, nn.Module):
        decoder = getattr(model, "base_model", None)
    return decoder if isinstance(decoder, nn.Module) and decoder is not model else None


def output_head(model: nn.Module) -> nn.Module | None:
    """The layer that turns `model`'s hidden states into the vocabulary's logits: its output
    embedding where it names one, else its `lm_head`; None where it has neither."""
    get_output = getattr(model, "get_output_embeddings", None)
    head = get_output() if callable(get_output) else None
    if not isinstance(head, nn.Module):
        head = getattr(model, "lm_head", None)
    return head if isinstance(head, nn.Module) else None


def why_not_swappable(model: nn.Module) -> str | None:
    """None if `model` is a causal LM whose loss can be swapped, else why not."""
    head = output_head(model)
    if not isinstance(head, nn.Linear):
        return "no nn.Linear output embedding (lm_head)"
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, nn.Module) and lm_head is not head:
        return "lm_head is not the output embedding"
    if decoder_of(model) is None:
        return "no decoder (get_decoder() or base_model)"
    if "labels" not in inspect.signature(model.forward).parameters:
        return "forward takes no labels"
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return "the logits are soft-capped or scaled before the loss"
    if getattr(model, "logit_scale", None) is not None:
        return "the logits are scaled before the loss"
    return None


def is_swapped(model: nn.Module) -> bool:
    return getattr(model.forward, "gputune_fused_loss", False)


def swap_loss(model: nn.Module) -> bool:
    """Wrap `model.forward` (an instance attribute: the class and other instances are
    untouched) so that calls with labels compute the fused loss. Returns whether it did."""
    if is_swapped(model) or why_not_swappable(model) is not None:
        return False
    import gputune_kernels
    from transformers.modeling_outputs import CausalLMOutputWithPast

    original = model.forward
    decoder = decoder_of(model)
    head = output_head(model)
    # Positional arguments are mapped to names here, once: inspect inside the wrapper would
    # break torch.compile's graph.
    positional = [
        p.name for p in inspect.signature(original).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]

    @functools.wraps(original)
    def forward(*args, **kwargs):
        kwargs.update(zip(positional, args))
        labels = kwargs.get("labels")
        if labels is None or kwargs.get("return_dict") is False:
            return original(**kwargs)
        shift_labels = kwargs.get("shift_labels")
        items = kwargs.get("num_items_in_batch")
        out = decoder(**{k: v for k, v in kwargs.items() if k not in _HEAD_ONLY})
        hidden = out[0]
        if shift_labels is None:
            # Hugging Face's shift: position t predicts label t+1; the last predicts nothing.
            shift_labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        reduction = "sum" if items is not None else "mean"
        loss = gputune_kernels.fused_linear_cross_entropy(
            hidden, head.weight, shift_labels.to(hidden.device), ignore_index=IGNORE_INDEX,
            reduction=reduction, bias=head.bias,
        )
        if items is not None:
            loss = loss / items
        return CausalLMOutputWithPast(
            loss=loss,
            logits=None,
            hidden_states=getattr(out, "hidden_states", None),
            attentions=getattr(out, "attentions", None),
        )

    forward.gputune_fused_loss = True
    model.forward = forward
    return True


def swap_losses(model: nn.Module) -> int:
    """Swap the loss of every Hugging Face causal LM in `model` (usually the model itself)."""
    return sum(swap_loss(m) for m in model.modules())

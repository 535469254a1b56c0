"""The transformer shapes the memory model's priors use (`search.memory_prior.ModelShape`), read
from a built model: a Hugging Face config (`model.config`) or a built-in workload's `shape`.
{} where the model says neither (a CNN, a user's own module): the memory model then scales
measured trials without priors."""

from __future__ import annotations


def _first(obj, *names):
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def model_shape(model, seq_len: int) -> dict:
    # Under compile or DDP the user's model sits inside a wrapper.
    for wrapper in ("_orig_mod", "module"):
        model = getattr(model, wrapper, model)
    src = getattr(model, "config", None) or getattr(model, "shape", None)
    if src is None:
        return {}
    hidden = _first(src, "hidden_size", "n_embd")
    heads = _first(src, "num_attention_heads", "n_head")
    layers = _first(src, "num_hidden_layers", "n_layer")
    vocab = _first(src, "vocab_size")
    if not all(isinstance(v, int) for v in (hidden, heads, layers, vocab)):
        return {}
    # GPT-2's MLP is one up projection of 4h (n_inner None); count it as an intermediate of 4h.
    intermediate = _first(src, "intermediate_size", "ffn_hidden", "n_inner") or 4 * hidden
    kv_heads = _first(src, "num_key_value_heads", "n_kv_head") or heads
    shape = {"layers": layers, "hidden": hidden, "intermediate": int(intermediate),
             "heads": heads, "kv_heads": int(kv_heads), "vocab": vocab, "seq_len": int(seq_len)}
    if getattr(src, "repeats_kv", False):  # memory_prior.ModelShape.kv_repeated
        shape["kv_repeated"] = True
    if getattr(src, "loss_in_fp32", True) is False:  # memory_prior.ModelShape.loss_in_fp32
        shape["loss_in_fp32"] = False
    return shape


def parameter_shapes(model) -> int:
    """How many distinct (shape, dtype) the trainable parameters take: torchao's AdamW compiles
    its step once for each (EfficientNet-B0 has about 70, a Llama 6)."""
    return len({(tuple(p.shape), p.dtype) for p in model.parameters() if p.requires_grad})

"""float8 training of the linear layers with torchao (`convert_to_float8_training`).

Each chosen `nn.Linear` becomes torchao's Float8Linear: inputs, weights and output gradients
are cast to float8 (e4m3) with dynamic scales, per tensor (tensorwise) or per row (rowwise), and
the matmuls run on float8 tensor cores (compute capability 8.9+). Left out: the LM head (its
weight is the output embedding or is tied to the input one; its error reaches the loss
directly), layers whose dims are not multiples of 16 (the float8 matmul's requirement) and,
with `fp8_layers = auto` (the default), layers too small for float8 to pay for its casts.
Applied after the kernel swap (whose modules keep their nn.Linear children) and before
checkpointing and compile, as torchtitan orders them; it is fastest under torch.compile.
"""

from __future__ import annotations

from torch import nn

from strategies.config import ConfigError


def lm_head_weights(model: nn.Module) -> set[int]:
    """ids of the weights that produce the logits: the output embedding (Hugging Face's
    `get_output_embeddings()`), a module named lm_head, and any Linear tied to an embedding."""
    heads: set[int] = set()
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    if isinstance(output, nn.Module) and getattr(output, "weight", None) is not None:
        heads.add(id(output.weight))
    for name, module in model.named_modules():
        if name.split(".")[-1] == "lm_head" and getattr(module, "weight", None) is not None:
            heads.add(id(module.weight))
        if isinstance(module, nn.Embedding):
            heads.add(id(module.weight))
    return heads


def float8_filter(model: nn.Module, recipe: str = "tensorwise", layers: str = "all"):
    """Which linears to convert. `layers = auto` also leaves out those too small for float8 to
    pay for its casts, by torchao's own thresholds for the recipe (from its H100 benchmarks;
    e.g. tensorwise leaves out a Llama 1B's k and v projections, 2048 -> 512)."""
    heads = lm_head_weights(model)
    big_enough = _large_enough(recipe) if layers == "auto" else None

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or id(module.weight) in heads:
            return False
        out_features, in_features = module.weight.shape
        if out_features % 16 or in_features % 16:
            return False
        return big_enough is None or big_enough(module, fqn)

    return keep


def _large_enough(recipe: str):
    """torchao's size filter for the recipe (an experimental API: where this torchao lacks it,
    every linear counts as large enough)."""
    try:
        from torchao.float8.float8_linear_utils import _auto_filter_for_recipe
    except ImportError:
        return None
    return _auto_filter_for_recipe(recipe, filter_fqns=[])


def inapplicable(model, blocks) -> dict[str, str]:
    keep = float8_filter(model, layers="all")
    if any(keep(m, name) for name, m in model.named_modules()):
        return {}
    why = "no nn.Linear float8 takes (dims multiples of 16, not the LM head)"
    return {"fp8": why, "fp8_layers": why}


def apply(run, config) -> None:
    if config.fp8 == "off":
        run.report["float8"] = {"linears": 0}
        return
    if run.device_type != "cuda":
        raise ConfigError(f"fp8 = {config.fp8} needs a CUDA GPU of compute capability 8.9+; "
                          f"device = {run.device_type}")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    linears = [(name, m) for name, m in run.model.named_modules() if isinstance(m, nn.Linear)]
    keep = float8_filter(run.model, config.fp8, config.fp8_layers)
    chosen = sum(1 for name, m in linears if keep(m, name))
    convert_to_float8_training(
        run.model,
        module_filter_fn=keep,
        config=Float8LinearConfig.from_recipe_name(config.fp8),
    )
    run.report["float8"] = {"linears": chosen, "of": len(linears), "recipe": config.fp8,
                            "layers": config.fp8_layers}

"""torch.compile, of the whole model or of each repeated block.

Compiles in place (`nn.Module.compile`), so the model object, its parameter names and the
optimizer's references stay the same. Compilation itself happens at the first forward pass;
the trainer reports that step's time as the compile time.
"""

from __future__ import annotations

from strategies.blocks import shape_kinds


def compile_kwargs(config) -> dict:
    return {
        "mode": None if config.compile_mode == "default" else config.compile_mode,
        "fullgraph": config.compile_fullgraph,
    }


def _alike(blocks) -> bool:
    """Per-block compile pays where the blocks share one shape: one graph, compiled once and
    reused. Blocks of several shapes each compile again, and Dynamo recompiles them with
    dynamic shapes: ResNet-50 per block on the H200 ran at 0.43x its whole-model compile
    (3.1k against 7.2k images/s, three runs) and took longer to compile (72-86 s against
    44-52 s)."""
    return bool(blocks) and shape_kinds(blocks) == 1


def inapplicable(model, blocks) -> dict[str, str]:
    if not blocks:
        return {"compile_scope=block": "no repeated blocks: the whole model is compiled"}
    kinds = shape_kinds(blocks)
    if kinds > 1:
        return {"compile_scope=block": f"the repeated blocks come in {kinds} "
                                       "shapes, each compiled again with dynamic shapes (slower "
                                       "than one graph): the whole model is compiled"}
    return {}


def apply(run, config) -> None:
    if config.compile_mode == "off":
        run.report["compile"] = {"compiled": 0}
        return
    kwargs = compile_kwargs(config)
    if config.compile_scope == "block":
        blocks = run.repeated_blocks()
        if _alike(blocks):
            for block in blocks:
                block.compile(**kwargs)
            run.report["compile"] = {"compiled": len(blocks), "scope": "block", **kwargs}
            return
    run.model.compile(**kwargs)
    run.report["compile"] = {"compiled": 1, "scope": "model", **kwargs}

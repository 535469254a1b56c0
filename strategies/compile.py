"""torch.compile, of the whole model or of each repeated block.

Compiles in place (`nn.Module.compile`), so the model object, its parameter names and the
optimizer's references stay the same. Compilation itself happens at the first forward pass;
the trainer reports that step's time as the compile time.
"""

from __future__ import annotations



def compile_kwargs(config) -> dict:
    return {
        "mode": None if config.compile_mode == "default" else config.compile_mode,
        "fullgraph": config.compile_fullgraph,
    }


def inapplicable(model, blocks) -> dict[str, str]:
    if blocks:
        return {}
    return {"compile_scope=block": "no repeated blocks: the whole model is compiled"}


def apply(run, config) -> None:
    if config.compile_mode == "off":
        run.report["compile"] = {"compiled": 0}
        return
    kwargs = compile_kwargs(config)
    if config.compile_scope == "block":
        blocks = run.repeated_blocks()
        if blocks:
            for block in blocks:
                block.compile(**kwargs)
            run.report["compile"] = {"compiled": len(blocks), "scope": "block", **kwargs}
            return
    run.model.compile(**kwargs)
    run.report["compile"] = {"compiled": 1, "scope": "model", **kwargs}

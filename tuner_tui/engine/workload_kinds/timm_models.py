"""`timm:NAME`: one of timm's models (those `timm.list_models()` names), random weights,
trained on synthetic images of its input size over its classes, both from its configuration."""

from __future__ import annotations

import difflib

from tuner_tui.engine.paths import module_exists

ARGUMENT = "NAME"
EXAMPLE = "timm:vit_base_patch16_224"
TAKES = ()
WHY_NOT_TAKEN = "it trains on images of the model's input size"


def check(name: str) -> str | None:
    if not module_exists("timm"):
        return "needs the timm package: pip install timm"
    return None  # the name is looked up in the worker, which imports timm


def build(name: str, seq_len, seed: int, data, device: str):
    import torch

    from tuner_tui.engine.workload_kinds import import_package
    from tuner_tui.engine.workload_kinds.images import image_workload
    from tuner_tui.engine.workloads.errors import WorkloadError

    timm = import_package("timm")
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise WorkloadError(f"timm {timm.__version__} has no model {name!r} (timm.list_models() "
                            f"names them){hint}")

    def build_model():
        return timm.create_model(name, pretrained=False)

    with torch.device("meta"):
        probe = build_model()
    classes = getattr(probe, "num_classes", 0)
    if not classes:
        raise WorkloadError(f"{name} has no classifier head (num_classes = 0)")
    input_size = tuple(import_package("timm.data").resolve_model_data_config(probe)["input_size"])
    return image_workload(f"timm:{name}", build_model, input_size, classes, seed, device)

"""`torchvision:NAME`: one of torchvision's classification models (those
`torchvision.models.list_models(module=torchvision.models)` names), random weights, trained on
synthetic images of the size its published weights were trained at (224 for most, 299 for
inception_v3) over its 1000 classes."""

from __future__ import annotations

import difflib

from tuner_tui.engine.paths import module_exists

ARGUMENT = "NAME"
EXAMPLE = "torchvision:resnet50"
TAKES = ()
WHY_NOT_TAKEN = "it trains on images of the model's input size"
CLASSES = 1000


def check(name: str) -> str | None:
    if not module_exists("torchvision"):
        return "needs the torchvision package: pip install torchvision (the build for your torch)"
    return None  # the name is looked up in the worker, which imports torchvision


def build(name: str, seq_len, seed: int, data, device: str):
    from tuner_tui.engine.workload_kinds import import_package
    from tuner_tui.engine.workload_kinds.images import image_workload
    from tuner_tui.engine.workloads.errors import WorkloadError

    torchvision = import_package("torchvision")
    models = torchvision.models
    names = models.list_models(module=models)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise WorkloadError(f"torchvision {torchvision.__version__} has no classification model "
                            f"{name!r} (torchvision.models.list_models() names them){hint}")
    size = 224
    try:  # the weights' metadata (nothing is downloaded) give the size they were trained at
        size = models.get_model_weights(name).DEFAULT.transforms().crop_size[0]
    except Exception:
        pass
    return image_workload(
        f"torchvision:{name}", lambda: models.get_model(name, weights=None, num_classes=CLASSES),
        (3, size, size), CLASSES, seed, device,
    )

"""Workloads named by a kind and an argument, with no code to write:

    hf:PATH            a Hugging Face transformers model from its config.json
    torchvision:NAME   a torchvision classification model, e.g. torchvision:resnet50
    timm:NAME          a timm model, e.g. timm:vit_base_patch16_224

Built with random weights: nothing is downloaded. A kind is one module here and its line in
`KINDS`. The module has `ARGUMENT` (what follows the colon, for messages), `TAKES` (which of
--seq-len and --data apply), `check(arg)`, which says what is wrong with the argument without
importing torch (the CLI asks it before any worker starts), and `build(arg, seq_len, seed,
data, device)`, which the worker calls and which returns a `Workload`.

This package imports no torch; the kinds' `build` does.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = {
    "hf": "tuner_tui.engine.workload_kinds.hf",
    "torchvision": "tuner_tui.engine.workload_kinds.torchvision_models",
    "timm": "tuner_tui.engine.workload_kinds.timm_models",
}
"""The prefix before the colon, and the module that builds that kind."""

RUN_OPTIONS = {"seq_len": "--seq-len", "data": "--data"}


def kind_of(name: str) -> ModuleType | None:
    """The module of the workload kind `name` starts with (`hf:...`), or None."""
    kind, sep, _ = name.partition(":")
    return importlib.import_module(KINDS[kind]) if sep and kind in KINDS else None


def _usage(name: str) -> str:
    kind = name.partition(":")[0]
    return f"{kind}:{kind_of(name).ARGUMENT}"


def check(name: str, seq_len: int | None = None, data: str | None = None) -> str | None:
    """What is wrong with the workload `name` of a kind and the run options given with it, in
    one line; None where nothing is found before the worker builds it."""
    module = kind_of(name)
    arg = name.partition(":")[2]
    if not arg:
        return f"workload {name!r}: give {_usage(name)}, e.g. {module.EXAMPLE}"
    given = {"seq_len": seq_len, "data": data}
    for key, flag in RUN_OPTIONS.items():
        if given[key] is not None and key not in module.TAKES:
            return f"{flag} does not apply to {name}: {module.WHY_NOT_TAKEN}"
    problem = module.check(arg)
    return f"workload {name!r}: {problem}" if problem else None


def build(name: str, seq_len: int | None, seed: int, data: str | None, device: str):
    """The `Workload` of `name` (in the worker). WorkloadError with one line for the user."""
    from tuner_tui.engine.workloads.errors import WorkloadError

    problem = check(name, seq_len, data)
    if problem:
        raise WorkloadError(problem)
    try:
        return kind_of(name).build(name.partition(":")[2], seq_len, seed, data, device)
    except WorkloadError as exc:
        raise WorkloadError(f"workload {name!r}: {exc}") from None
    except MemoryError:  # (the worker says so itself)
        raise
    except Exception as exc:  # a library's own check of the model: its line, not a dead worker
        what, kind = first_line(exc), type(exc).__name__
        raise WorkloadError(f"workload {name!r} does not build: "
                            f"{what if what == kind else f'{kind}: {what}'}") from None


def first_line(exc: BaseException) -> str:
    """An exception's first line, or its type's name where it says nothing."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def import_package(package: str) -> ModuleType:
    """`import package` in the worker, or WorkloadError with one line: a package can be
    installed and still not import (a torchvision built for another torch)."""
    from tuner_tui.engine.workloads.errors import WorkloadError

    try:
        return importlib.import_module(package)
    except Exception as exc:  # any failure of a third-party import is the same news
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise WorkloadError(f"the {package} package does not import here: {detail}") from None

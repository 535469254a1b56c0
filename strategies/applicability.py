"""Options that change nothing in a given model, and options that would change how it trains,
as plain data.

The worker finds them when it builds the workload (`strategies.compose.inapplicable`, which asks
each strategy module) and sends them in its description of the workload
(`WorkerReady.workload["inapplicable"]`), e.g.

    {"attention": "no attention module gputune switches",
     "fused_kernels=linear_cross_entropy": "no vocabulary head (lm_head)",
     "checkpointing": "no repeated blocks", "checkpoint_every": "no repeated blocks"}

A key is an option (`KEY`: none of its values other than the default changes the model) or one
choice of an option (`KEY=CHOICE`: that value changes nothing; for a set option such as
fused_kernels, that member). Labels leave them out (`TuneConfig.label(skip=...)`), the dashboard
shows the reason beside the option, and the search leaves them out of its space.

The options that would change how the model trains beyond rounding come the same way
(`WorkerReady.workload["changes_training"]`, from `strategies.compose.changes_training`), e.g.
`{"micro_batch_size": "its 20 BatchNorm layers would normalize each micro-batch by ..."}`. Labels
keep them (the run is another one); the search holds them at their default, since the gradient
gate would refuse every other value.

Torch-free: the dashboard and the headless commands read it.
"""

from __future__ import annotations

from typing import Any, Mapping

from strategies.config import TuneConfig
from strategies.registry import OPTIONS


def split_key(key: str) -> tuple[str, str | None]:
    """`"fused_kernels=swiglu"` -> `("fused_kernels", "swiglu")`; `"attention"` -> `("attention", None)`."""
    option, sep, choice = key.partition("=")
    return option, (choice if sep else None)


def _known(key: str) -> bool:
    option, choice = split_key(key)
    if option not in OPTIONS:
        return False
    choices = getattr(OPTIONS[option], "choices", None)
    return choice is None or (choices is not None and choice in choices)


def inapplicable_options(workload: Mapping[str, Any] | None) -> dict[str, str]:
    """The options and choices (`KEY`, `KEY=CHOICE`) that change nothing in the workload a
    worker described, each with the reason; {} where the worker found none or could not tell.
    Keys this version does not know are left out."""
    return _described(workload, "inapplicable")


def training_changing_options(workload: Mapping[str, Any] | None) -> dict[str, str]:
    """The options whose values other than the default would train the workload's model
    differently beyond rounding (`WorkerReady.workload["changes_training"]`: micro-batches
    under BatchNorm), each with the reason: the gradient gate refuses them, so the search
    leaves them out."""
    return _described(workload, "changes_training")


def _described(workload: Mapping[str, Any] | None, field: str) -> dict[str, str]:
    found = (workload or {}).get(field) or {}
    if not isinstance(found, Mapping):
        return {}
    return {k: v for k, v in found.items()
            if isinstance(k, str) and isinstance(v, str) and _known(k)}


def why_the_same(config: TuneConfig, earlier: TuneConfig,
                 inapplicable: Mapping[str, str]) -> list[str]:
    """`KEY: reason` for each option in which `config` differs from `earlier` and that changes
    nothing in the model."""
    lines: list[str] = []
    before = earlier.to_dict()
    for key, value in config.to_dict().items():
        if value == before[key]:
            continue
        if isinstance(value, list):
            found = [f"{key}={m}" for m in sorted(set(value) ^ set(before[key]))]
        else:
            found = [f"{key}={v}" for v in (value, before[key])]
        for k in [key] if key in inapplicable else found:
            line = f"{k}: {inapplicable[k]}" if k in inapplicable else None
            if line and line not in lines:
                lines.append(line)
    return lines


def distinct(configs: list[TuneConfig],
             inapplicable: Mapping[str, str]) -> tuple[list[TuneConfig], list[str]]:
    """`configs` less those that train the model as an earlier one does once the options that
    change nothing in it are left out (a CNN's `+ sdpa` rung of the ladder), or that are the
    same configuration as an earlier one (rungs an override made equal), and a line for each
    of those."""
    seen: dict[TuneConfig, TuneConfig] = {}
    kept, lines = [], []
    for config in configs:
        same = config.without(inapplicable)
        if same in seen:
            why = "; ".join(why_the_same(config, seen[same], inapplicable))
            lines.append(f"{config.label()}: the same as {seen[same].label(skip=inapplicable)} "
                         + (f"for this model ({why})" if why else "(the same configuration)"))
            continue
        seen[same] = config
        kept.append(config)
    return kept, lines

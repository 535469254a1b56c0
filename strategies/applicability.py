"""Options that change nothing in a given model, as plain data.

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
    found = (workload or {}).get("inapplicable") or {}
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

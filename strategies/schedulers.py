"""The user's LR schedulers, kept when `apply` replaces their optimizer.

A torch LR scheduler holds its optimizer (`scheduler.optimizer`) and writes the rate into that
optimizer's param groups. When a choice needs another optimizer class (bf16 weights; bf16,
8-bit or offloaded state), the new optimizer is built on the very group dicts of the user's
optimizer, so every write of a scheduler lands where the new optimizer reads; and each torch
scheduler made on the old optimizer is pointed at the new one, so that `get_last_lr`, its
state_dict and its step-order check follow the optimizer that steps.

Nothing in torch lists an optimizer's schedulers: they are found among the objects that refer
to it (`gc.get_referrers`), once, at `apply`, only when a scheduler has wrapped its `step`.
"""

from __future__ import annotations

import functools
import gc
import weakref

import torch


def has_lr_scheduler(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a torch LR scheduler was made on `optimizer` (schedulers wrap its `step`)."""
    return hasattr(optimizer.step, "_wrapped_by_lr_sched")


def schedulers_of(optimizer: torch.optim.Optimizer) -> list:
    """The torch LR schedulers (`LRScheduler`, which includes ReduceLROnPlateau, SequentialLR
    and the schedulers inside it) whose optimizer is `optimizer`."""
    from torch.optim.lr_scheduler import LRScheduler

    found: dict[int, object] = {}
    for referrer in gc.get_referrers(optimizer):
        # An object refers to the optimizer itself, or (once its __dict__ was made a real dict,
        # as `state_dict()` does) through that dict.
        owners = gc.get_referrers(referrer) if type(referrer) is dict else (referrer,)
        for owner in owners:
            if isinstance(owner, LRScheduler) and getattr(owner, "optimizer", None) is optimizer:
                found[id(owner)] = owner
    return list(found.values())


def track_step_calls(optimizer: torch.optim.Optimizer) -> None:
    """Wrap `optimizer.step` as a torch scheduler does when it is made on it: the wrapper marks
    the optimizer as stepped, which the scheduler's first `step` checks."""
    if has_lr_scheduler(optimizer):
        return
    step = type(optimizer).step
    owner = weakref.ref(optimizer)  # no cycle through the instance's own attribute

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        stepped = owner()
        stepped._opt_called = True
        return step(stepped, *args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    optimizer.step = wrapper


def repoint(old: torch.optim.Optimizer, new: torch.optim.Optimizer, why: str) -> list:
    """Point every scheduler made on `old` at `new`, and retire `old`: its `step` raises,
    naming `why` (the choice that replaced it), instead of stepping the model a second time
    with stale state. Returns the schedulers moved."""
    moved = []
    if has_lr_scheduler(old):
        for scheduler in schedulers_of(old):
            scheduler.optimizer = new
            moved.append(scheduler)
        if moved:
            track_step_calls(new)
    name = type(old).__name__

    def retired_step(*args, **kwargs):
        from strategies.config import ConfigError

        raise ConfigError(f"this {name} was replaced by strategies.apply ({why}): step "
                          "tuned.optimizer, or call tuned.step(loss)")

    old.step = retired_step
    return moved


def copy_hyperparameters(groups: list[dict], inner: list[list[dict]]) -> None:
    """Copy each of `groups`' settings (lr, betas, weight_decay, ...) into the groups made from
    it (`inner[i]` for `groups[i]`), for the keys those hold; a tensor there (torchao's lr) is
    filled in place, so a compiled step keeps its input."""
    for group, targets in zip(groups, inner, strict=True):
        for target in targets:
            for key, value in group.items():
                if key == "params" or key not in target:
                    continue
                current = target[key]
                if isinstance(current, torch.Tensor):
                    current.fill_(float(value))
                else:
                    target[key] = value.item() if isinstance(value, torch.Tensor) else value


def groups_made_from(groups: list[dict], per_parameter: dict,
                     on_device: list[dict]) -> list[list[dict]]:
    """For each of `groups`, the groups torchao's CPU offload made from it: one per offloaded
    parameter (`per_parameter`: device parameter -> its own optimizer) and the group of its
    parameters too small to offload (`on_device`), if any."""
    made = []
    for group in groups:
        ids = {id(p) for p in group["params"]}
        mine = [opt.param_groups[0] for p, opt in per_parameter.items() if id(p) in ids]
        mine += [g for g in on_device if g["params"] and id(g["params"][0]) in ids]
        made.append(mine)
    return made

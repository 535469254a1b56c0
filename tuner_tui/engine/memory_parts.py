"""The bytes that parameters, gradients and optimizer state hold on the training device.

Measured after the first optimizer step (when the optimizer's state exists and the gradients
have not been freed yet), so that the memory model can split a measured peak into these parts
and the activations and the rest. Each storage is counted once (tied weights, views), and only
storages on the run's device: torchao's CPU offload keeps its state in host memory.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def _storages(value, device: torch.device, seen: dict[tuple, int]) -> None:
    """Add every storage reachable from `value` (tensors, tensor subclasses such as torchao's
    8-bit state or DTensor, and dicts, lists and tuples of them) to `seen`."""
    if isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            names, _ = value.__tensor_flatten__()
            for name in names:
                _storages(getattr(value, name), device, seen)
            return
        if value.device.type != device.type or (
            device.index is not None and value.device.index not in (None, device.index)
        ):
            return
        storage = value.untyped_storage()
        seen[(storage.device.type, storage.device.index, storage.data_ptr())] = storage.nbytes()
    elif isinstance(value, dict):
        for item in value.values():
            _storages(item, device, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _storages(item, device, seen)


def tensor_bytes(values, device: torch.device) -> int:
    seen: dict[tuple, int] = {}
    _storages(list(values), device, seen)
    return sum(seen.values())


def _optimizer_states(state_dict) -> list:
    """The "state" parts of an optimizer's state_dict, also when optimizers are nested (torchao's
    CPUOffloadOptimizer: {"offloaded": [...], "on-device": {...}}, and no `.state` of its own).
    A state_dict holds the state tensors themselves, not copies."""
    if isinstance(state_dict, dict):
        if "state" in state_dict and "param_groups" in state_dict:
            return [state_dict["state"]]
        return [s for v in state_dict.values() for s in _optimizer_states(v)]
    if isinstance(state_dict, (list, tuple)):
        return [s for v in state_dict for s in _optimizer_states(v)]
    return []


def memory_parts(model: torch.nn.Module, optimizer, device: torch.device) -> dict[str, int]:
    params = list(model.parameters())
    states = _optimizer_states(optimizer.state_dict()) if optimizer is not None else []
    return {
        "parameters": tensor_bytes(params, device),
        # Gradients and optimizer state exist for these alone (a frozen backbone has neither).
        "trainable": tensor_bytes([p for p in params if p.requires_grad], device),
        "gradients": tensor_bytes([p.grad for p in params if p.grad is not None], device),
        "optimizer_state": tensor_bytes(states, device),
    }

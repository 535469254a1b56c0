"""The AdamW update: which implementation steps it, and where and in what its state is kept.

The rule for the user's optimizer and LR scheduler: a choice that only changes how torch's AdamW
steps (plain, foreach, fused) is made on the optimizer the user passed, in place (its param
groups and defaults get the new flags). A choice that needs another optimizer class replaces
it by one built on the very same param-group dicts (lr, betas, eps, weight_decay and any keys
of the user's own), and every torch LR scheduler made on the old optimizer is pointed at the new
one (`strategies.schedulers`): a scheduler made before `apply` keeps setting the rate of the
optimizer that steps, in every mode. `TunedRun.optimizer` is then the new one,
`report["optimizer"]["replaced"]` is True, and the old one's `step` raises.

| weights | optimizer_state | optimizer that steps                                          |
|---------|-----------------|---------------------------------------------------------------|
| fp32    | fp32            | the user's torch AdamW/Adam, in place, `optimizer` = plain/foreach/fused |
| fp32    | bf16            | torchao AdamW with bf16 moments                               |
| any     | 8bit            | torchao AdamW8bit (blockwise 8-bit moments)                   |
| fp32    | offload         | torchao CPUOffloadOptimizer around torch's AdamW (`optimizer`'s flags) |
| bf16    | fp32 / bf16     | torchao AdamW with fp32 / bf16 moments, stochastic rounding   |
| bf16    | offload         | torchao CPUOffloadOptimizer around torchao AdamW (fp32 moments, stochastic rounding) |

With bf16 weights every torchao optimizer rounds the update stochastically
(`bf16_stochastic_round=True`), so updates far below a bf16 ulp still move the weights on average.
torchao's optimizers compile their per-parameter step (one compilation per parameter shape,
on the first step) and hold `lr` as a tensor: torch's LR schedulers update it in place.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch

from strategies.config import ConfigError
from strategies.schedulers import has_lr_scheduler, repoint  # noqa: F401 (has_lr_scheduler: API)

# Optimizers whose constructor takes both `foreach` and `fused`.
_SUPPORTED = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)
# Group keys that choose torch's implementation; torchao's optimizers take none of them.
_TORCH_FLAGS = ("foreach", "fused", "capturable", "differentiable", "maximize",
                "decoupled_weight_decay")


def implementation_flags(choice: str) -> dict:
    return {
        "plain": {"foreach": False, "fused": False},
        "foreach": {"foreach": True, "fused": False},
        "fused": {"foreach": False, "fused": True},
    }[choice]


@functools.cache
def adamw_with_state(dtype: torch.dtype) -> type:
    """torchao's AdamW with its moments in `dtype` (its own keeps them in the parameter's)."""
    from torchao.optim import _AdamW

    class AdamWWithState(_AdamW):
        def _new_buffer(self, p, signed):
            return torch.zeros_like(p, dtype=dtype)

    return AdamWWithState


def _is_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """AdamW, or Adam without weight decay (the same update)."""
    if isinstance(optimizer, torch.optim.AdamW):
        return True
    return isinstance(optimizer, torch.optim.Adam) and all(
        not g.get("weight_decay") for g in optimizer.param_groups
    )


@functools.cache
def offload_optimizer_class() -> type:
    """torchao's CPU offload whose `param_groups` are the groups it was made from. torchao's
    own are one per offloaded parameter, on the CPU, which a scheduler made on the user's
    optimizer cannot drive; here a scheduler sets the rate in the user's groups and each step
    first copies their settings into the per-parameter groups made from them."""
    from torchao.optim import CPUOffloadOptimizer

    from strategies.schedulers import copy_hyperparameters, groups_made_from

    class OffloadedAdamW(CPUOffloadOptimizer):
        def __init__(self, param_groups: list[dict], **kwargs):
            super().__init__([dict(g) for g in param_groups], **kwargs)  # torchao pops "params"
            self._groups = param_groups
            self._made_from = groups_made_from(param_groups, self.optim_dict, self.d_param_groups)

        @property
        def param_groups(self) -> list[dict]:
            return self._groups

        def step(self, closure=None):
            copy_hyperparameters(self._groups, self._made_from)
            return super().step(closure)

    return OffloadedAdamW


def _torchao_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The user's group dicts themselves, less the keys that choose torch's implementation
    (torchao's optimizers take none): what a scheduler writes there, the new optimizer reads."""
    for group in optimizer.param_groups:
        if group.get("maximize"):
            raise ConfigError("optimizer_state and weights = bf16 replace AdamW by torchao's, "
                              "which has no maximize=True; use maximize=False")
    for group in optimizer.param_groups:
        for key in _TORCH_FLAGS:
            group.pop(key, None)
    return optimizer.param_groups


def build(optimizer: torch.optim.Optimizer, config) -> tuple[torch.optim.Optimizer, dict]:
    """The optimizer that steps `config`, and what the report says about it."""
    state, bf16 = config.optimizer_state, config.weights == "bf16"
    flags = implementation_flags(config.optimizer)
    if state == "fp32" and not bf16:
        groups = [{**group, **flags} for group in optimizer.param_groups]
        return type(optimizer)(groups), {"type": type(optimizer).__name__, "state": "fp32",
                                         "implementation_applied": True, **flags}
    if not _is_adamw(optimizer):
        what = f"optimizer_state = {state}" if state != "fp32" else "weights = bf16"
        raise ConfigError(f"{what} replaces AdamW by torchao's; this optimizer is "
                          f"{type(optimizer).__name__} (use torch.optim.AdamW)")
    import torchao.optim as ao

    groups = _torchao_groups(optimizer)
    if state == "offload":
        if bf16:
            inner = {"optimizer_class": adamw_with_state(torch.float32),
                     "bf16_stochastic_round": True}
        else:
            inner = {"optimizer_class": torch.optim.AdamW, **flags}
        new = offload_optimizer_class()(groups, **inner)
        report = {"type": "CPUOffloadOptimizer",
                  "steps_on_cpu": "torchao AdamW" if bf16 else "torch AdamW",
                  "state": "fp32 on the CPU", "implementation_applied": not bf16}
        if not bf16:
            report.update(flags)
    elif state == "8bit":
        new = ao.AdamW8bit(groups, bf16_stochastic_round=bf16)
        report = {"type": "AdamW8bit", "state": "8bit", "implementation_applied": False}
    else:
        dtype = torch.float32 if state == "fp32" else torch.bfloat16
        new = adamw_with_state(dtype)(groups, bf16_stochastic_round=bf16)
        report = {"type": "torchao AdamW", "state": state, "implementation_applied": False}
    report["stochastic_rounding"] = bf16
    return new, report


def set_implementation(optimizer: torch.optim.Optimizer, flags: dict) -> None:
    """Give `optimizer` the implementation `flags` in place, before its first step.

    A throwaway optimizer of the same class is built from the same groups first, so the
    constructor's own checks (fused needs floating-point parameters on a supported device, not
    differentiable) refuse what it would refuse."""
    groups = [{**group, **flags} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in {**optimizer.defaults, **flags}.items() if k in accepted and k != "params"}
    probe = type(optimizer)(groups, **settings)
    for group in optimizer.param_groups:
        group.update(flags)
    optimizer.defaults.update(flags)
    # GradScaler hands a fused optimizer its scale instead of unscaling the gradients first.
    optimizer._step_supports_amp_scaling = getattr(probe, "_step_supports_amp_scaling", False)


def apply(run, config) -> None:
    optimizer = run.optimizer
    if optimizer is None:
        run.report["optimizer"] = {"changed": False, "replaced": False, "reason": "no optimizer given"}
        return
    default = config.optimizer_state == "fp32" and config.weights == "fp32"
    if default and not isinstance(optimizer, _SUPPORTED):
        run.report["optimizer"] = {
            "changed": False,
            "replaced": False,
            "reason": f"{type(optimizer).__name__} has no foreach/fused choice; left as is",
        }
        return
    if any(optimizer.state.values()):
        raise ConfigError(
            "optimizer already has state: call strategies.apply before the first optimizer step"
        )
    if config.optimizer_state == "offload" and run.device_type != "cuda":
        raise ConfigError(f"optimizer_state = offload needs a CUDA GPU (torchao's CPU offload); "
                          f"device = {run.device_type}")
    if default:
        flags = implementation_flags(config.optimizer)
        set_implementation(optimizer, flags)
        run.report["optimizer"] = {"changed": True, "replaced": False,
                                   "type": type(optimizer).__name__, "state": "fp32",
                                   "implementation_applied": True, **flags}
        return
    run.optimizer, report = build(optimizer, config)
    why = (f"optimizer_state = {config.optimizer_state}" if config.optimizer_state != "fp32"
           else "weights = bf16")
    schedulers = repoint(optimizer, run.optimizer, why)
    run.report["optimizer"] = {"changed": True, "replaced": True, **report,
                               "schedulers_moved": [type(s).__name__ for s in schedulers]}
    compiled_step = not (config.optimizer_state == "offload" and config.weights == "fp32")
    cycled = [s for s in schedulers
              if getattr(s, "cycle_momentum", False) and getattr(s, "use_beta1", False)]
    if compiled_step and cycled:
        # torchao passes beta1 to its compiled step as a constant: a new value, a new compile.
        warnings.warn(f"{type(cycled[0]).__name__} cycles AdamW's beta1 every step, and with "
                      f"{why} torchao's AdamW compiles its step again for each value: make it "
                      "with cycle_momentum=False", stacklevel=3)


def copies_gradients_to_cpu(optimizer) -> bool:
    """Whether `optimizer` is torchao's CPU offload, or made from it (`offload_optimizer_class`
    is): checked by the class's ancestry, without importing torchao on every step."""
    return any(cls.__name__ == "CPUOffloadOptimizer" for cls in type(optimizer).__mro__)


def clip_gradients(optimizer, parameters, max_norm: float) -> None:
    """Clip the global gradient norm to `max_norm`.

    torchao's CPU offload copies each gradient to the CPU as soon as backward has produced it,
    before clipping can know the global norm; the norm is taken from the GPU gradients (still
    there) and the CPU copies are scaled by the same factor once their copy has landed."""
    parameters = list(parameters)
    total = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if not copies_gradients_to_cpu(optimizer):
        return
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0).cpu()
    for p_device, copied in optimizer.queue.items():
        copied.synchronize()
        optimizer.param_d2h_map[p_device].grad.mul_(factor)

"""Data parallel training over the ranks of a torch.distributed process group.

ddp: `DistributedDataParallel`: every rank holds the whole model; gradients are all-reduced in
buckets while backward runs. fsdp2: `fully_shard` on each repeated block, then on the root:
parameters, gradients and optimizer state are sharded across ranks, and each block gathers its
parameters just before it runs. A normalization with running statistics (BatchNorm) is a group of
its own, gathered in fp32 beside its fp32 statistics.

It needs an initialised process group: the one torchrun sets up in your own script
(`torch.distributed.init_process_group()` before `strategies.apply`), or the group of processes
gputune starts for a configuration with devices > 1. It comes after activation checkpointing
(the checkpointed blocks are what FSDP2 shards) and before compile (which then traces the
wrapped model), as torchtitan composes them.
"""

from __future__ import annotations

import torch

from strategies.config import ConfigError

_COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(config):
    """FSDP2's policy from the configuration: parameters gathered in the autocast dtype (or in
    the weights' own low precision) and gradients reduced in fp32, or in bf16 where
    fsdp_reduce = bf16 (half the bytes on the wire); fp32 and tf32 gather fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param_dtype = _COMPUTE_DTYPES.get(config.precision)
    weights = getattr(config, "weights", "fp32")  # an option another strategy may add
    if param_dtype is None and weights in _COMPUTE_DTYPES:
        param_dtype = _COMPUTE_DTYPES[weights]
    reduce_dtype = torch.float32 if param_dtype is not None else None
    if config.fsdp_reduce == "bf16":
        reduce_dtype = torch.bfloat16
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def _require_process_group(config):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"parallel = {config.parallel} needs a torch.distributed process group "
            f"(devices = {config.devices}): run under torchrun and call "
            "torch.distributed.init_process_group() before strategies.apply"
        )
    return dist


def apply_ddp(run, config) -> None:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.cuda.current_device()] if run.device_type == "cuda" else None
    run.model = DistributedDataParallel(
        run.model,
        device_ids=device_ids,
        bucket_cap_mb=config.ddp_bucket_mb,
        gradient_as_bucket_view=config.ddp_bucket_view,
    )


def apply_fsdp2(run, config) -> dict:
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision_policy(config)
    blocks = run.repeated_blocks()
    # fully_shard replaces each parameter by a sharded DTensor parameter: remember the names, so
    # that the optimizer can be pointed at the new ones.
    names = {id(p): name for name, p in run.model.named_parameters()}
    reshard = config.fsdp_reshard
    norms = _shard_running_statistics(run.model, policy)
    for i, block in enumerate(blocks):
        # The last block's backward starts right after its forward: resharding it would only
        # gather the same parameters again.
        fully_shard(block, reshard_after_forward=reshard and i < len(blocks) - 1, mp_policy=policy)
    fully_shard(run.model, reshard_after_forward=reshard, mp_policy=policy)
    if run.optimizer is not None:
        if any(run.optimizer.state.values()):
            raise ConfigError(
                "optimizer already has state: call strategies.apply before the first optimizer step"
            )
        sharded = dict(run.model.named_parameters())
        for group in run.optimizer.param_groups:
            group["params"] = [sharded.get(names.get(id(p)), p) for p in group["params"]]
    dtype = policy.param_dtype
    return {
        "blocks": len(blocks),
        "param_dtype": str(dtype).replace("torch.", "") if dtype else "float32",
        "reduce_dtype": str(policy.reduce_dtype or torch.float32).replace("torch.", ""),
        "reshard_after_forward": reshard,
        "fp32_groups_beside_running_statistics": norms,
    }


def _shard_running_statistics(model, policy) -> int:
    """A normalization that keeps running statistics (BatchNorm) keeps fp32 parameters beside
    its fp32 statistics (`weights.py`): its kernel refuses bf16 weights beside them, and FSDP2
    gathers one dtype per group (bf16 weights elsewhere would mix two). Each becomes a group of
    its own, gathered in fp32 and kept gathered after forward (a few numbers a channel)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from strategies.weights import has_running_statistics

    norms = [m for m in model.modules()
             if has_running_statistics(m) and any(True for _ in m.parameters(recurse=False))]
    keep = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=policy.reduce_dtype,
                                cast_forward_inputs=False)
    for module in norms:
        fully_shard(module, reshard_after_forward=False, mp_policy=keep)
    return len(norms)


def apply(run, config) -> None:
    if config.parallel == "none":
        run.report["data_parallel"] = {"parallel": "none"}
        return
    dist = _require_process_group(config)
    report = {"parallel": config.parallel, "world_size": dist.get_world_size()}
    if config.parallel == "ddp":
        apply_ddp(run, config)
        report.update(
            bucket_mb=config.ddp_bucket_mb,
            gradient_as_bucket_view=config.ddp_bucket_view,
        )
    else:
        report.update(apply_fsdp2(run, config))
    run.report["data_parallel"] = report

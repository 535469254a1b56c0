"""The rules across options: each takes a configuration's values and returns one line that names
both options and what is allowed, or None. `TuneConfig` checks every configuration against
`RULES`; a new rule is one function and one line there. Plain data, no torch."""

from __future__ import annotations


def _fullgraph_needs_compile(values: dict) -> str | None:
    """compile_fullgraph = true needs a compile_mode other than off."""
    if values["compile_fullgraph"] and values["compile_mode"] == "off":
        return "compile_fullgraph = true needs compile_mode other than off (compile_mode = off)"
    return None


def _bf16_weights_need_bf16_precision(values: dict) -> str | None:
    """weights = bf16 needs precision = bf16."""
    if values["weights"] == "bf16" and values["precision"] != "bf16":
        return (
            f"weights = bf16 needs precision = bf16 (bf16 parameters run their matmuls in bf16; "
            f"autocast keeps the losses and norms in fp32), not precision = {values['precision']}"
        )
    return None


def _devices_need_parallel(values: dict) -> str | None:
    """devices > 1 needs parallel = ddp or fsdp2 (parallel with devices = 1 runs a group of one,
    which measures what the wrapper costs)."""
    if values["devices"] > 1 and values["parallel"] == "none":
        return (
            f"devices = {values['devices']} needs parallel = ddp or fsdp2 (parallel = none "
            "trains on one device)"
        )
    return None


def _micro_batch_divides_batch(values: dict) -> str | None:
    """micro_batch_size divides the batch (each rank's share, batch_size / devices)."""
    batch, micro = values["batch_size"], values["micro_batch_size"]
    per_rank = batch // values["devices"] if batch and batch % values["devices"] == 0 else batch
    if per_rank and micro and per_rank % micro:
        return micro_batch_problem(per_rank, micro)
    return None


def micro_batch_problem(batch: int, micro: int) -> str:
    divisors = ", ".join(str(d) for d in range(1, batch + 1) if batch % d == 0)
    return (
        f"micro_batch_size = {micro} does not divide batch_size = {batch}: allowed micro-batch "
        f"sizes are 0 (the whole batch) or a divisor of {batch} ({divisors})"
    )


def _offload_without_grad_scaler(values: dict) -> str | None:
    """optimizer_state = offload cannot run with precision = fp16 (its GradScaler)."""
    if values["optimizer_state"] == "offload" and values["precision"] == "fp16":
        return (
            "optimizer_state = offload cannot run with precision = fp16: the GradScaler would "
            "unscale the GPU gradients after they were copied to the CPU; use precision = bf16"
        )
    return None


def _batch_divides_over_devices(values: dict) -> str | None:
    """batch_size is a multiple of devices."""
    batch, devices = values["batch_size"], values["devices"]
    if batch and batch % devices:
        return (
            f"batch_size = {batch} is not a multiple of devices = {devices}: each rank trains "
            "on batch_size / devices sequences"
        )
    return None


RULES = (
    _fullgraph_needs_compile,
    _bf16_weights_need_bf16_precision,
    _micro_batch_divides_batch,
    _offload_without_grad_scaler,
    _devices_need_parallel,
    _batch_divides_over_devices,
)
"""Checks across options; each returns a message that names both options, or None."""

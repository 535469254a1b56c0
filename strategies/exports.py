"""A configuration in the files other trainers read, and every export's write.

One function per trainer gives its fields as plain data, with a note for each choice it has no
field for (and the gputune call that makes it):

- `hf_training_arguments`: Hugging Face `transformers.TrainingArguments` fields;
- `accelerate_config`: an Accelerate config file (`accelerate launch --config_file`);
- `lightning_trainer`: PyTorch Lightning's `Trainer` arguments, under `trainer:` as LightningCLI
  reads them.

`render` writes them as YAML, the notes as comments; `write` writes any export (gputune's own
TOML/JSON too), keeping the file it replaces as `NAME.1`, `NAME.2`, ... Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from strategies.config import ExportedConfig, TuneConfig, document_text, format_of
from strategies.errors import ConfigError
from strategies.files import WriteError, keep_previous, write_atomic

TRAINER_FORMATS = ("hf", "accelerate", "lightning")
TRAINER_NAMES = {"hf": "Hugging Face TrainingArguments", "accelerate": "Accelerate config",
                 "lightning": "Lightning Trainer arguments"}
APPLY = "gputune.apply"
"""The gputune call the notes name; the file's header shows it whole (`APPLY_CALL`)."""
APPLY_CALL = 'tuned = gputune.apply(gputune.load("{source}"), model, optimizer)'
"""It makes every choice of the configuration: tuned.model, tuned.optimizer, tuned.step."""

# gputune's kernels that Liger-Kernel (transformers' `use_liger_kernel`) also fuses, by the
# keys of `liger_kernel_config`.
LIGER_KEYS = {"rms_norm": "rms_norm", "swiglu": "swiglu", "cross_entropy": "cross_entropy",
              "linear_cross_entropy": "fused_linear_cross_entropy"}


@dataclass(frozen=True)
class TrainerArguments:
    """What one trainer reads: `fields` as its loader takes them, and `notes`, one line per
    choice it has no field for."""

    fields: dict
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Batch:
    """The batch a configuration trains at, split as a trainer takes it."""

    per_device: int
    """Samples per device per forward/backward (the micro-batch)."""
    accumulation: int

    @classmethod
    def of(cls, config: TuneConfig, batch_size: int | None) -> "Batch | None":
        """None when the batch is the workload's default and the file does not say which."""
        batch = config.batch_size or batch_size
        if not batch:
            return None
        per_rank = batch // config.devices
        micro = config.micro_batch_size or per_rank
        return cls(micro, per_rank // micro)


def _batch_note(config: TuneConfig, where: str) -> str:
    return (f"batch_size = {config.batch_size or 'the workload default'}: not known to this "
            f"file; set {where}")


def _checkpointing_note(config: TuneConfig) -> str:
    every = ""
    if config.checkpointing == "every-n":
        every = f" (one block in {config.checkpoint_every})"
    return (f"checkpointing = {config.checkpointing}{every}: per-block activation checkpointing "
            f"the trainer cannot choose; {APPLY} applies it")


def _clips_cpu_copies(config: TuneConfig) -> bool:
    """Clipping with offloaded state: torchao copies each gradient to the CPU during backward,
    so a trainer's clipping, after it, misses the copies; the trainer's own is left off."""
    return config.optimizer_state == "offload" and bool(config.grad_clip)


def _common_notes(config: TuneConfig, *, compile_field: bool, kernels_field: bool,
                  fp8_field: bool) -> list[str]:
    """Notes for the choices no trainer here has a field for."""
    notes = []
    if config.attention == "sdpa":
        notes.append("attention = sdpa: load the model with attn_implementation=\"sdpa\" "
                     f"(Hugging Face); for other models {APPLY} swaps it in")
    if config.weights == "bf16":
        notes.append("weights = bf16: bf16 parameters and gradients stepped by an AdamW with "
                     f"stochastic rounding; {APPLY} builds it (tuned.optimizer)")
    if config.fused_kernels and not kernels_field:
        kernels = ", ".join(config.effective_kernels()) or "none under compile"
        notes.append(f"fused_kernels = {kernels}: gputune's Triton kernels; {APPLY} swaps them in")
    if config.fp8 != "off" and not fp8_field:
        notes.append(f"fp8 = {config.fp8} ({config.fp8_layers} layers): torchao float8 linears; "
                     f"{APPLY} converts them")
    if config.compile_mode != "off" and not compile_field:
        notes.append(f"compile_mode = {config.compile_mode}: torch.compile(model, "
                     f"mode=\"{config.compile_mode}\"), or {APPLY}")
    if config.optimizer_state in ("bf16", "offload"):
        what = {"bf16": "AdamW with bf16 moments", "offload": "AdamW state and step on the CPU "
                "(torchao CPUOffloadOptimizer)"}[config.optimizer_state]
        notes.append(f"optimizer_state = {config.optimizer_state}: {what}; {APPLY} builds it "
                     "(tuned.optimizer)")
    if _clips_cpu_copies(config):
        # (the trainer clips the GPU's gradients after backward: the CPU's were copied during it)
        notes.append(f"grad_clip = {config.grad_clip:g} with optimizer_state = offload: a "
                     "trainer's clipping misses the gradients' CPU copies; turn it off and call "
                     "strategies.optimizer.clip_gradients(tuned.optimizer, model.parameters(), "
                     f"{config.grad_clip:g}) before the step (tuned.step does)")
    return notes


# -- Hugging Face ---------------------------------------------------------------------------------
def hf_training_arguments(config: TuneConfig, batch_size: int | None = None) -> TrainerArguments:
    """`transformers.TrainingArguments` fields for `config`: `TrainingArguments(output_dir=...,
    **fields)`. `batch_size`: the batch measured, where the configuration's is the workload's
    default (0)."""
    fields: dict = {"bf16": config.precision == "bf16", "fp16": config.precision == "fp16"}
    if config.precision == "tf32":
        fields["tf32"] = True
    fields["max_grad_norm"] = 0.0 if _clips_cpu_copies(config) else config.grad_clip
    notes = _common_notes(config, compile_field=True, kernels_field=True, fp8_field=False)

    batch = Batch.of(config, batch_size)
    if batch is None:
        notes.append(_batch_note(config, "per_device_train_batch_size and "
                                         "gradient_accumulation_steps yourself"))
    else:
        fields["per_device_train_batch_size"] = batch.per_device
        fields["gradient_accumulation_steps"] = batch.accumulation

    fields["gradient_checkpointing"] = config.checkpointing == "full"
    if config.checkpointing == "full":
        fields["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    elif config.checkpointing != "off":
        notes.append(_checkpointing_note(config))

    fields["torch_compile"] = config.compile_mode != "off"
    if config.compile_mode != "off":
        fields["torch_compile_backend"] = "inductor"
        fields["torch_compile_mode"] = config.compile_mode
        if config.compile_fullgraph or config.compile_scope == "block":
            notes.append(f"compile_fullgraph = {str(config.compile_fullgraph).lower()}, "
                         f"compile_scope = {config.compile_scope}: no field; "
                         f"{APPLY} compiles so")

    fields["optim"] = _hf_optim(config)
    if config.optimizer == "plain" and config.optimizer_state in ("fp32", "offload") \
            and config.weights == "fp32":
        notes.append("optimizer = plain: torch's AdamW with foreach=False; optim adamw_torch "
                     "lets torch choose (foreach on GPUs)")

    kernels = config.effective_kernels()
    liger = [k for k in kernels if k in LIGER_KEYS]
    if liger:
        fields["use_liger_kernel"] = True
        chosen = {LIGER_KEYS[k] for k in liger}
        if "fused_linear_cross_entropy" in chosen:
            chosen.discard("cross_entropy")  # Liger takes one of the two
        fields["liger_kernel_config"] = {key: key in chosen for key in (
            "rms_norm", "swiglu", "cross_entropy", "fused_linear_cross_entropy")} | {"rope": False}
    others = [k for k in kernels if k not in LIGER_KEYS]
    if others:
        notes.append(f"fused_kernels {', '.join(others)}: gputune's Triton kernels (Liger-Kernel "
                     f"has none of these); {APPLY} swaps them in")
    if config.fused_kernels and not kernels:
        notes.append("fused_kernels: under compile Inductor fuses what was chosen itself; "
                     "nothing to swap")

    _hf_parallel(config, fields, notes)
    return TrainerArguments(fields, tuple(notes))


def _hf_optim(config: TuneConfig) -> str:
    if config.optimizer_state == "8bit":
        return "adamw_torch_8bit"  # torchao's AdamW8bit, what gputune measured
    torch_steps = config.weights == "fp32" and config.optimizer_state != "bf16"
    if config.optimizer == "fused" and torch_steps:
        return "adamw_torch_fused"
    return "adamw_torch"


def _hf_parallel(config: TuneConfig, fields: dict, notes: list[str]) -> None:
    if config.parallel == "none":
        return
    notes.append(f"parallel = {config.parallel}, devices = {config.devices}: launch with "
                 f"torchrun --nproc-per-node {config.devices} (or accelerate launch)")
    if config.parallel == "ddp":
        fields["ddp_bucket_cap_mb"] = config.ddp_bucket_mb
        if config.ddp_bucket_view:
            notes.append("ddp_bucket_view = true: DDP's gradient_as_bucket_view, no field")
        return
    # transformers 5's FSDP: checkpointing inside FSDP's own wrapping, no second all-gather
    fields["fsdp"] = True
    fields["fsdp_config"] = {"version": 2, "reshard_after_forward": config.fsdp_reshard,
                             "activation_checkpointing": config.checkpointing == "full"}
    if config.checkpointing == "full":
        fields["gradient_checkpointing"] = False
        fields.pop("gradient_checkpointing_kwargs", None)
    if config.fsdp_reduce != "fp32":
        notes.append(f"fsdp_reduce = {config.fsdp_reduce}: FSDP2's MixedPrecisionPolicy("
                     "reduce_dtype=torch.bfloat16), no field")


# -- Accelerate -----------------------------------------------------------------------------------
def accelerate_config(config: TuneConfig, batch_size: int | None = None,
                      device: str = "cuda") -> TrainerArguments:
    """An Accelerate config (what `accelerate config` writes): mixed precision, dynamo, the
    processes and FSDP. `device`: where the configuration was measured (cpu sets use_cpu)."""
    mixed = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}[config.precision]
    if config.fp8 != "off":
        mixed = "fp8"
    distributed = {"none": "NO", "ddp": "MULTI_CPU" if device == "cpu" else "MULTI_GPU",
                   "fsdp2": "FSDP"}[config.parallel]
    fields: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "mixed_precision": mixed,
        "use_cpu": device == "cpu",
        "debug": False,
        "num_machines": 1,
        "num_processes": config.devices,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "downcast_bf16": "no",
    }
    notes = _common_notes(config, compile_field=True, kernels_field=False,
                          fp8_field=True)
    if config.precision == "tf32":
        notes.append("precision = tf32: torch.backends.cuda.matmul.allow_tf32 = True, no field")
    if config.fp8 != "off":
        fields["fp8_config"] = {"backend": "AO"}  # torchao, what gputune measured
        notes.append(f"fp8 = {config.fp8} ({config.fp8_layers} layers): Accelerate's AO backend "
                     f"converts by its own rules; {APPLY} converts as measured")
    if config.compile_mode != "off":
        fields["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": config.compile_mode,
            "dynamo_use_fullgraph": config.compile_fullgraph,
            "dynamo_use_dynamic": False,
            "dynamo_use_regional_compilation": config.compile_scope == "block",
        }
    if config.parallel == "fsdp2":
        fields["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": config.fsdp_reshard,
            "fsdp_activation_checkpointing": config.checkpointing == "full",
            "fsdp_offload_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
    in_fsdp = config.parallel == "fsdp2" and config.checkpointing == "full"
    if config.checkpointing == "full" and not in_fsdp:
        notes.append(_checkpointing_note(config) + "; on a Hugging Face model: "
                     "model.gradient_checkpointing_enable()")
    elif config.checkpointing != "off" and not in_fsdp:
        notes.append(_checkpointing_note(config))
    batch = Batch.of(config, batch_size)
    if batch is None:
        notes.append(_batch_note(config, "your DataLoader's batch_size and "
                                         "Accelerator(gradient_accumulation_steps=...)"))
    else:
        notes.append(f"batch: DataLoader batch_size={batch.per_device} per process, "
                     f"Accelerator(gradient_accumulation_steps={batch.accumulation})")
    if config.grad_clip and not _clips_cpu_copies(config):
        notes.append(f"grad_clip = {config.grad_clip:g}: accelerator.clip_grad_norm_("
                     f"model.parameters(), {config.grad_clip:g})")
    notes.append(_optimizer_note(config))
    if config.parallel == "ddp":
        notes.append(f"ddp_bucket_mb = {config.ddp_bucket_mb}, ddp_bucket_view = "
                     f"{str(config.ddp_bucket_view).lower()}: Accelerator(kwargs_handlers="
                     f"[DistributedDataParallelKwargs(bucket_cap_mb={config.ddp_bucket_mb}, "
                     f"gradient_as_bucket_view={config.ddp_bucket_view})])")
    return TrainerArguments(fields, tuple(notes))


def _optimizer_note(config: TuneConfig) -> str:
    if config.optimizer_state == "8bit":
        return "optimizer_state = 8bit: torchao.optim.AdamW8bit(model.parameters(), ...)"
    if config.optimizer_state in ("bf16", "offload") or config.weights == "bf16":
        return f"optimizer: the AdamW of {APPLY} (tuned.optimizer)"
    flags = {"plain": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}
    return f"optimizer = {config.optimizer}: torch.optim.AdamW(..., {flags[config.optimizer]})"


# -- Lightning ------------------------------------------------------------------------------------
def lightning_trainer(config: TuneConfig, batch_size: int | None = None) -> TrainerArguments:
    """PyTorch Lightning `Trainer` arguments, under `trainer:` as LightningCLI's config file
    holds them (`Trainer(**fields["trainer"])` without the CLI)."""
    precision = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                 "fp16": "16-mixed"}[config.precision]
    if config.weights == "bf16":
        precision = "bf16-true"
    trainer: dict = {"precision": precision}
    notes = _common_notes(config, compile_field=False, kernels_field=False,
                          fp8_field=False)
    if config.precision == "tf32":
        notes.append("precision = tf32: torch.set_float32_matmul_precision(\"high\") before fit")
    if config.grad_clip and not _clips_cpu_copies(config):
        trainer["gradient_clip_val"] = config.grad_clip
        trainer["gradient_clip_algorithm"] = "norm"
    batch = Batch.of(config, batch_size)
    if batch is None:
        notes.append(_batch_note(config, "your DataLoader's batch_size and "
                                         "accumulate_grad_batches"))
    else:
        trainer["accumulate_grad_batches"] = batch.accumulation
        notes.append(f"batch: DataLoader batch_size={batch.per_device} per device")
    if config.parallel != "none":
        trainer["devices"] = config.devices
        trainer["strategy"] = {"ddp": "ddp", "fsdp2": "fsdp"}[config.parallel]
        if config.parallel == "fsdp2":
            notes.append("parallel = fsdp2: Lightning's \"fsdp\" strategy is FSDP1; FSDP2 "
                         "(fully_shard per block) is ModelParallelStrategy with fully_shard in "
                         "configure_model")
        elif config.ddp_bucket_mb != 25 or config.ddp_bucket_view:
            notes.append(f"ddp_bucket_mb = {config.ddp_bucket_mb}: DDPStrategy(bucket_cap_mb="
                         f"{config.ddp_bucket_mb}, gradient_as_bucket_view="
                         f"{config.ddp_bucket_view})")
    if config.checkpointing != "off":
        notes.append(_checkpointing_note(config))
    notes.append(_optimizer_note(config) + ", returned by configure_optimizers")
    return TrainerArguments({"trainer": trainer}, tuple(notes))


# -- files ----------------------------------------------------------------------------------------
def trainer_path(path: str | os.PathLike, fmt: str) -> Path:
    """Where a trainer's file goes beside gputune's: gputune.toml -> gputune-hf.yaml."""
    path = Path(path)
    return path.with_name(f"{path.stem}-{fmt}.yaml")


def arguments_for(exported: ExportedConfig, fmt: str) -> TrainerArguments:
    measured_batch = exported.measured.get("batch_size")
    batch = measured_batch if isinstance(measured_batch, int) else None
    if fmt == "hf":
        return hf_training_arguments(exported.config, batch)
    if fmt == "accelerate":
        device = exported.environment.get("device") or "cuda"
        return accelerate_config(exported.config, batch, device)
    if fmt == "lightning":
        return lightning_trainer(exported.config, batch)
    raise ConfigError(f"unknown trainer format {fmt!r}: allowed formats are "
                      + ", ".join(TRAINER_FORMATS))


LOADERS = {
    "hf": 'TrainingArguments(output_dir="out", **yaml.safe_load(open("{name}")))  '
          '(transformers 5)',
    "accelerate": "accelerate launch --config_file {name} train.py",
    "lightning": 'python train.py fit --config {name}  (LightningCLI), or '
                 'Trainer(**yaml.safe_load(open("{name}"))["trainer"])',
}


def render(exported: ExportedConfig, fmt: str, name: str, source: str = "gputune.toml") -> str:
    """The YAML file of trainer `fmt`, named `name`, with its notes as comments."""
    arguments = arguments_for(exported, fmt)
    header = [f"# {TRAINER_NAMES[fmt]} from gputune: {exported.config.label()}"]
    measured = _measured_line(exported)
    if measured:
        header.append(f"# measured: {measured}")
    header.append(f"# use: {LOADERS[fmt].format(name=name)}")
    if arguments.notes:
        header.append(f"# No field here for these ({APPLY} does them all: "
                      f"{APPLY_CALL.format(source=source)}):")
        header += [f"#   - {note}" for note in arguments.notes]
    return "\n".join(header + _yaml(arguments.fields)) + "\n"


def _measured_line(exported: ExportedConfig) -> str:
    m, env = exported.measured, exported.environment
    parts = []
    if isinstance(m.get("tokens_per_s"), (int, float)):
        parts.append(f"{m['tokens_per_s'] / 1000:.1f}k {m.get('item_name') or 'tokens'}/s")
    elif isinstance(m.get("samples_per_s"), (int, float)):
        parts.append(f"{m['samples_per_s']:.1f} samples/s")
    where = env.get("gpu_name") or ("CPU" if env.get("device") == "cpu" else "")
    if where:
        parts.append(f"on {where}")
    if exported.workload:
        parts.append(f"({exported.workload})")
    return " ".join(parts)


def _scalar(value) -> str:
    # JSON's scalars are YAML's: strings quoted (so "no" stays a string), true/false, numbers.
    return json.dumps(value)


def _yaml(mapping: dict, indent: int = 0) -> list[str]:
    lines = []
    pad = "  " * indent
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            lines += _yaml(value, indent + 1)
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines


@dataclass(frozen=True)
class Written:
    """A file an export wrote, and where the file it replaced was kept (None: nothing was)."""

    path: Path
    fmt: str
    kept: Path | None = None

    def lines(self) -> list[str]:
        """What to tell the user, beside "exported ... to PATH"."""
        if self.kept is None:
            return []
        return [f"kept the previous {self.path.name} as {self.kept.name}"]


def write(config: TuneConfig | ExportedConfig, path: str | os.PathLike, fmt: str | None = None,
          source: str = "gputune.toml") -> Written:
    """Write `config` to `path` as `fmt` (toml, json, hf, accelerate or lightning; by default
    from the name: .toml or .json), atomically, keeping an existing different file there as
    `path.1` (then .2, ...)."""
    exported = config if isinstance(config, ExportedConfig) else ExportedConfig(config)
    path = Path(path)
    if fmt in TRAINER_FORMATS:
        text = render(exported, fmt, path.name, source)
    else:
        fmt = format_of(path, fmt)
        text = document_text(exported, fmt)
    try:
        kept = keep_previous(path, text)
        write_atomic(path, text)
    except WriteError as exc:
        raise ConfigError(str(exc)) from None
    return Written(path, fmt, kept)


def write_with_trainers(exported: ExportedConfig, path: str | os.PathLike,
                        trainers: tuple[str, ...] = ()) -> list[Written]:
    """gputune's file at `path`, then each trainer's beside it (`trainer_path`)."""
    written = [write(exported, path)]
    for fmt in trainers:
        written.append(write(exported, trainer_path(path, fmt), fmt, source=Path(path).name))
    return written


def parse_trainer_formats(items: list[str]) -> tuple[str, ...]:
    """`--format hf --format accelerate,lightning` to ("hf", "accelerate", "lightning")."""
    chosen: list[str] = []
    for item in items:
        for fmt in (t.strip().lower() for t in item.split(",")):
            if fmt not in TRAINER_FORMATS:
                raise ConfigError(f"--format {fmt!r} is not a trainer format: allowed formats "
                                  f"are {', '.join(TRAINER_FORMATS)} (gputune's own file is "
                                  "TOML or JSON by its extension)")
            if fmt not in chosen:
                chosen.append(fmt)
    return tuple(chosen)

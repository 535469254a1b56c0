"""The exports other trainers read: what each file holds (always), and each loaded by the real
library where it is installed (transformers and accelerate are in the test extra)."""

import re

import pytest

from strategies import exports
from strategies.config import ExportedConfig, TuneConfig, read, save

yaml = pytest.importorskip("yaml")

EVERYTHING = {
    "precision": "bf16", "weights": "bf16", "attention": "sdpa", "optimizer_state": "bf16",
    "fused_kernels": ["layer_norm", "rms_norm", "linear_cross_entropy", "gelu"],
    "kernels_with_compile": "all", "fp8": "rowwise", "checkpointing": "every-n",
    "compile_mode": "max-autotune-no-cudagraphs", "compile_scope": "block",
    "batch_size": 64, "micro_batch_size": 16,
}
"""A configuration with a choice in every family, several of which no trainer has a field for."""


def _file(tmp_path, fmt: str, changes: dict, measured: dict | None = None, environment=None):
    exported = ExportedConfig(TuneConfig.from_dict(changes), measured or {},
                              environment or {"device": "cuda", "gpu_name": "NVIDIA H200"},
                              "gpt2-124m")
    written = exports.write_with_trainers(exported, tmp_path / "gputune.toml", (fmt,))
    text = written[1].path.read_text()
    return yaml.safe_load(text), text


def _notes(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("changes, expected", [
    ({}, {"bf16": False, "fp16": False, "optim": "adamw_torch", "torch_compile": False,
          "gradient_checkpointing": False, "max_grad_norm": 1.0}),
    ({"precision": "bf16", "optimizer": "fused", "grad_clip": 0.5},
     {"bf16": True, "optim": "adamw_torch_fused", "max_grad_norm": 0.5}),
    ({"precision": "fp16"}, {"fp16": True, "bf16": False}),
    ({"precision": "tf32"}, {"tf32": True}),
    ({"compile_mode": "reduce-overhead"},
     {"torch_compile": True, "torch_compile_mode": "reduce-overhead",
      "torch_compile_backend": "inductor"}),
    ({"checkpointing": "full"},
     {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}),
    ({"optimizer_state": "8bit"}, {"optim": "adamw_torch_8bit"}),
    ({"batch_size": 64, "micro_batch_size": 16},
     {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4}),
    ({"parallel": "ddp", "devices": 2, "batch_size": 64, "micro_batch_size": 8},
     {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "ddp_bucket_cap_mb": 25}),
    ({"parallel": "fsdp2", "devices": 2, "checkpointing": "full", "fsdp_reshard": False},
     {"fsdp": True, "gradient_checkpointing": False, "fsdp_config": {
         "version": 2, "reshard_after_forward": False, "activation_checkpointing": True}}),
    ({"fused_kernels": ["rms_norm", "swiglu", "cross_entropy", "linear_cross_entropy"]},
     {"use_liger_kernel": True, "liger_kernel_config": {
         "rms_norm": True, "swiglu": True, "cross_entropy": False,
         "fused_linear_cross_entropy": True, "rope": False}}),
])
def test_hf_fields(tmp_path, changes, expected):
    fields, _ = _file(tmp_path, "hf", changes, {"batch_size": 16})
    assert {k: fields[k] for k in expected} == expected
    if not changes.get("fused_kernels"):
        assert "use_liger_kernel" not in fields


def test_the_batch_measured_stands_for_the_workload_default(tmp_path):
    fields, _ = _file(tmp_path, "hf", {"micro_batch_size": 4}, {"batch_size": 16})
    assert (fields["per_device_train_batch_size"], fields["gradient_accumulation_steps"]) == (4, 4)
    fields, text = _file(tmp_path, "hf", {}, {})
    assert "per_device_train_batch_size" not in fields
    assert "set per_device_train_batch_size and gradient_accumulation_steps yourself" in text


@pytest.mark.parametrize("fmt", exports.TRAINER_FORMATS)
def test_what_a_trainer_has_no_field_for_is_named_with_the_gputune_call(tmp_path, fmt):
    _, text = _file(tmp_path, fmt, EVERYTHING, {"tokens_per_s": 547841.7})
    notes = _notes(text)
    assert 'tuned = gputune.apply(gputune.load("gputune.toml"), model, optimizer)' in notes
    assert "547.8k tokens/s on NVIDIA H200 (gpt2-124m)" in notes
    for option in ("weights = bf16", "optimizer_state = bf16", "checkpointing = every-n",
                   "attention = sdpa"):
        line = next((ln for ln in notes.splitlines() if option in ln), None)
        assert line is not None and "gputune.apply" in line, (option, notes)
    if fmt == "hf":  # Liger has the norms and the loss, not GELU or LayerNorm
        assert re.search(r"fused_kernels layer_norm, gelu: .*gputune\.apply", notes)
        assert "fp8 = rowwise" in notes and "compile_scope = block" in notes


@pytest.mark.parametrize("fmt", exports.TRAINER_FORMATS)
def test_offloaded_state_with_clipping_says_how_to_clip_the_cpu_copies(tmp_path, fmt):
    """torchao's offload copies the gradients to the CPU during backward: a trainer's own
    clipping comes after and misses them (the run trains unclipped)."""
    fields, text = _file(tmp_path, fmt, {"precision": "bf16", "optimizer_state": "offload",
                                         "grad_clip": 0.5})
    assert "grad_clip = 0.5 with optimizer_state = offload" in _notes(text)
    assert "clip_gradients(tuned.optimizer, model.parameters(), 0.5)" in _notes(text)
    # The trainer's own clipping is left off (it would clip the on-device part alone).
    assert "accelerator.clip_grad_norm_" not in _notes(text)
    assert fields.get("max_grad_norm", 0.0) == 0.0
    assert "gradient_clip_val" not in (fields.get("trainer") or {})
    _, text = _file(tmp_path, fmt, {"precision": "bf16", "optimizer_state": "bf16",
                                    "grad_clip": 0.5})
    assert "clip_gradients" not in _notes(text)


def test_accelerate_fields(tmp_path):
    fields, _ = _file(tmp_path, "accelerate", {"precision": "bf16", "compile_mode": "default",
                                               "parallel": "fsdp2", "devices": 4,
                                               "checkpointing": "full", "fp8": "tensorwise"})
    assert fields["mixed_precision"] == "fp8" and fields["fp8_config"] == {"backend": "AO"}
    assert (fields["distributed_type"], fields["num_processes"]) == ("FSDP", 4)
    assert fields["dynamo_config"]["dynamo_mode"] == "default"
    assert fields["fsdp_config"]["fsdp_version"] == 2
    assert fields["fsdp_config"]["fsdp_activation_checkpointing"] is True
    fields, _ = _file(tmp_path, "accelerate", {}, environment={"device": "cpu"})
    # "no" quoted: YAML would read a bare no as False
    assert (fields["mixed_precision"], fields["distributed_type"], fields["use_cpu"]) == (
        "no", "NO", True)
    assert "dynamo_config" not in fields


def test_lightning_fields(tmp_path):
    fields, _ = _file(tmp_path, "lightning", {"precision": "bf16", "weights": "bf16",
                                              "batch_size": 32, "micro_batch_size": 8})
    assert fields == {"trainer": {"precision": "bf16-true", "gradient_clip_val": 1.0,
                                  "gradient_clip_algorithm": "norm",
                                  "accumulate_grad_batches": 4}}
    fields, _ = _file(tmp_path, "lightning", {"precision": "fp16", "grad_clip": 0.0,
                                              "parallel": "ddp", "devices": 2})
    assert fields == {"trainer": {"precision": "16-mixed", "devices": 2, "strategy": "ddp"}}


def test_an_export_over_a_file_keeps_the_old_one_and_says_so(tmp_path):
    path = tmp_path / "gputune.toml"
    first = exports.write(TuneConfig.from_dict({"precision": "bf16"}), path)
    assert first.kept is None and first.lines() == []
    again = exports.write(TuneConfig.from_dict({"precision": "bf16"}), path)
    assert again.kept is None  # the same bytes: nothing lost, nothing kept
    for n, precision in ((1, "fp32"), (2, "fp16")):
        written = exports.write(TuneConfig.from_dict({"precision": precision}), path)
        assert written.kept == tmp_path / f"gputune.toml.{n}"
        assert written.lines() == [f"kept the previous gputune.toml as gputune.toml.{n}"]
    assert read(path).config.precision == "fp16"
    assert read(tmp_path / "gputune.toml.1").config.precision == "bf16"
    assert read(tmp_path / "gputune.toml.2").config.precision == "fp32"
    save(TuneConfig(), path)  # the library's save keeps it too
    assert (tmp_path / "gputune.toml.3").exists()


def test_trainer_formats_are_checked():
    assert exports.parse_trainer_formats(["hf", "accelerate,lightning", "hf"]) == (
        "hf", "accelerate", "lightning")
    with pytest.raises(exports.ConfigError, match="--format 'toml' is not a trainer format: "
                                                  "allowed formats are hf, accelerate, lightning"):
        exports.parse_trainer_formats(["toml"])


# -- the real libraries ---------------------------------------------------------------------------
HF_CONFIGS = [
    {}, {"precision": "bf16", "optimizer": "fused"}, {"compile_mode": "max-autotune"},
    {"checkpointing": "full"}, {"optimizer_state": "8bit"},
    {"fused_kernels": ["rms_norm", "swiglu", "linear_cross_entropy"]},
    {"parallel": "ddp", "devices": 2, "batch_size": 8},
    {"parallel": "fsdp2", "devices": 2, "batch_size": 8, "checkpointing": "full"},
    EVERYTHING,
]


@pytest.mark.parametrize("changes", HF_CONFIGS)
def test_transformers_takes_the_hf_fields(tmp_path, changes):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' Trainer and TrainingArguments need it
    fields, _ = _file(tmp_path, "hf", changes, {"batch_size": 16})
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none",
                                          use_cpu=True, **fields)
    assert args.optim.value == fields["optim"]
    assert args.per_device_train_batch_size == fields["per_device_train_batch_size"]


def test_a_trainer_steps_with_the_hf_fields_on_the_cpu(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    changes = {"precision": "bf16", "optimizer": "fused", "checkpointing": "full",
               "batch_size": 4, "micro_batch_size": 2, "grad_clip": 0.5}
    fields, _ = _file(tmp_path, "hf", changes)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none",
                                          use_cpu=True, max_steps=1, save_strategy="no",
                                          logging_strategy="no", **fields)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    tokens = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    before = model.lm_head.weight.detach().clone()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.optimizer.defaults["fused"] is True
    assert model.is_gradient_checkpointing
    assert (args.gradient_accumulation_steps, args.per_device_train_batch_size) == (2, 2)
    assert not torch.equal(before, model.lm_head.weight)


@pytest.mark.parametrize("changes", [{}, {"precision": "bf16", "compile_mode": "default"},
                                     {"parallel": "fsdp2", "devices": 2, "fp8": "tensorwise"},
                                     {"parallel": "ddp", "devices": 2}])
def test_accelerate_reads_its_config(tmp_path, changes):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    fields, _ = _file(tmp_path, "accelerate", changes)
    loaded = ClusterConfig.from_yaml_file(str(tmp_path / "gputune-accelerate.yaml"))
    assert loaded.mixed_precision == fields["mixed_precision"]
    assert loaded.distributed_type.value == fields["distributed_type"]
    assert loaded.dynamo_config == fields.get("dynamo_config", {})


@pytest.mark.parametrize("changes", [{}, {"precision": "bf16", "batch_size": 8,
                                          "micro_batch_size": 2}])
def test_lightning_takes_the_trainer_arguments(tmp_path, changes):
    try:
        from lightning.pytorch import Trainer
    except ImportError:
        Trainer = pytest.importorskip("pytorch_lightning").Trainer
    fields, _ = _file(tmp_path, "lightning", changes)
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      **fields["trainer"])
    assert trainer.accumulate_grad_batches == fields["trainer"].get("accumulate_grad_batches", 1)

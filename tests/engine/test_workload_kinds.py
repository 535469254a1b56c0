"""Workloads named by kind, no code: `hf:PATH` from a config.json, `torchvision:NAME`,
`timm:NAME`. Tiny configs written here, built and stepped on the CPU; the errors a user meets
are one line each, found before any measurement."""

from __future__ import annotations

import json

import pytest
import torch

from strategies import hf_causal_lm_loss
from tuner_tui.engine import workload_kinds
from tuner_tui.engine.workload_kinds import hf, images, timm_models, torchvision_models
from tuner_tui.engine.workloads import WorkloadError, load

TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
CONFIGS = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **TINY,
              "torch_dtype": "bfloat16", "attention_dropout": 0.1},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **TINY,
              "tie_word_embeddings": True},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 512,
             "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128, "resid_pdrop": 0.1,
             "embd_pdrop": 0.1, "attn_pdrop": 0.1, "bos_token_id": 0, "eos_token_id": 0},
    "classifier": {"architectures": ["LlamaForSequenceClassification"], "model_type": "llama",
                   **TINY, "num_labels": 3},
}


def write_config(folder, doc) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(doc))
    return str(folder)


def train(workload, steps=3, batch_size=2):
    torch.manual_seed(0)
    model = workload.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        loss = workload.loss(model, workload.batch(step, batch_size, torch.device("cpu")))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_a_causal_lm_from_its_config_trains_and_takes_the_fused_loss(tmp_path, kind):
    path = write_config(tmp_path / f"tiny-{kind}", CONFIGS[kind])
    workload = load(f"hf:{path}", seq_len=32)
    assert workload.name.startswith(f"hf:tiny-{kind}#") and workload.items_per_sample == 32
    assert workload.item_name == "tokens" and workload.flops_per_item is not None
    model, losses = train(workload)
    assert all(torch.isfinite(torch.tensor(losses)))
    # Random fp32 weights whatever the config's dtype; SDPA; no cache; dropout off.
    assert next(model.parameters()).dtype == torch.float32
    assert model.config._attn_implementation == "sdpa" and model.config.use_cache is False
    assert all(v == 0.0 for k, v in model.config.to_dict().items()
               if k.endswith(("dropout", "pdrop")) and isinstance(v, float))
    # The loss is the model's own, from labels: gputune's fused loss can take its place.
    assert hf_causal_lm_loss.why_not_swappable(model) is None
    not_used = workload.inapplicable()
    assert "fused_kernels=linear_cross_entropy" not in not_used and "attention" not in not_used
    assert "fused_kernels=causal_softmax" in not_used
    # (read on the meta device: Llama's and Qwen2's RMSNorms are told there to be plain ones)
    assert ("fused_kernels=rms_norm" in not_used) == (kind == "gpt2")


def test_a_model_without_sdpa_attention_builds_with_its_own(tmp_path):
    """Gemma 2 (in transformers 5) attends only its own way: the SDPA that gputune asks for
    first is refused, and that refusal, left in the config, had refused the model's own build
    too ("cannot build model_type 'gemma2'")."""
    pytest.importorskip("transformers.models.gemma2")
    doc = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **TINY,
           "head_dim": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    workload = load(f"hf:{write_config(tmp_path / 'tiny-gemma2', doc)}", seq_len=32)
    model, losses = train(workload, steps=2)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert model.config._attn_implementation != "sdpa"


def test_a_sequence_classifier_learns_a_label_per_sequence(tmp_path):
    workload = load(f"hf:{write_config(tmp_path / 'cls', CONFIGS['classifier'])}/config.json")
    inputs, labels = workload.batch(0, 4, torch.device("cpu"))
    assert labels.shape == (4,) and int(labels.max()) < 3
    assert workload.items_per_sample == 128  # the config's context, under the 1024 cap
    _, losses = train(workload)
    assert all(torch.isfinite(torch.tensor(losses)))
    not_used = workload.inapplicable()
    assert "no vocabulary head" in not_used["fused_kernels=linear_cross_entropy"]


def test_an_edited_config_is_another_workload(tmp_path):
    first = load(f"hf:{write_config(tmp_path / 'm', CONFIGS['qwen2'])}")
    second = load(f"hf:{write_config(tmp_path / 'm', {**CONFIGS['qwen2'], 'hidden_size': 32})}")
    assert first.name != second.name  # the result store keys on the name


@pytest.mark.parametrize("setup, words", [
    (lambda p: None, ["does not exist", "config.json or a folder holding one"]),
    (lambda p: p.mkdir(), ["holds no config.json"]),
    (lambda p: write_config(p, None) and (p / "config.json").write_text("{nope"),
     ["is not valid JSON"]),
    (lambda p: write_config(p, {"vocab_size": 5}), ["names no model_type", '"model_type": "llama"']),
    (lambda p: write_config(p, {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}),
     ["'T5ForConditionalGeneration' is not one gputune builds", "...ForCausalLM"]),
])
def test_a_bad_path_or_config_is_one_line_before_any_worker(tmp_path, setup, words):
    path = tmp_path / "model"
    setup(path)
    problem = workload_kinds.check(f"hf:{path}")
    assert problem.startswith(f"workload 'hf:{path}': ") and "\n" not in problem
    for word in words:
        assert word in problem


def test_an_unknown_architecture_is_one_line_from_the_worker(tmp_path):
    path = write_config(tmp_path / "m", {"model_type": "no_such_model", **TINY})
    assert workload_kinds.check(f"hf:{path}") is None  # only transformers knows its types
    with pytest.raises(WorkloadError, match=r"^workload 'hf:.*': unknown architecture: "
                       r"transformers .* does not know model_type 'no_such_model'"):
        load(f"hf:{path}")


def test_a_model_that_its_library_refuses_to_build_is_one_line_from_the_worker(tmp_path):
    """A padding id outside the vocabulary: torch's Embedding asserts as transformers builds the
    model. The worker had died of it, and the user read "the worker did not start (exit code 1)"."""
    doc = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **TINY,
           "pad_token_id": 32000}
    path = write_config(tmp_path / "m", doc)
    with pytest.raises(WorkloadError, match=r"^workload 'hf:.*' does not build: AssertionError: "
                       r"Padding_idx must be within num_embeddings$"):
        load(f"hf:{path}")


def test_a_sequence_longer_than_the_context_or_run_options_that_do_not_apply(tmp_path):
    path = write_config(tmp_path / "m", CONFIGS["qwen2"])
    with pytest.raises(WorkloadError, match="--seq-len 256 is longer than the config's context"):
        load(f"hf:{path}", seq_len=256)
    assert "--seq-len does not apply to torchvision:resnet18" in workload_kinds.check(
        "torchvision:resnet18", seq_len=64)
    assert "--data does not apply to timm:resnet18" in workload_kinds.check(
        "timm:resnet18", data="a.txt")
    assert "give hf:PATH" in workload_kinds.check("hf:")


@pytest.mark.parametrize("module, name, package", [
    (torchvision_models, "torchvision:resnet18", "torchvision"),
    (timm_models, "timm:resnet18", "timm"),
    (hf, "hf:.", "transformers"),
])
def test_a_missing_package_is_one_line(monkeypatch, module, name, package):
    monkeypatch.setattr(module, "module_exists", lambda dotted: dotted != package)
    assert workload_kinds.check(name) == (f"workload {name!r}: needs the {package} package: "
                                          f"pip install {package}" + (
                                              " (the build for your torch)"
                                              if package == "torchvision" else ""))


def test_a_package_that_does_not_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_vision.py").write_text("raise OSError('libcudart.so.13: no such file\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError, match="^the broken_vision package does not import here: "
                       "libcudart.so.13: no such file$"):
        workload_kinds.import_package("broken_vision")


def test_an_image_classifier_workload(monkeypatch):
    from examples.vision_cnn import SmallResNet

    workload = images.image_workload("cnn", lambda: SmallResNet(classes=10), (3, 16, 16), 10,
                                     seed=0, device="cpu")
    assert workload.item_name == "images" and workload.items_per_sample == 1
    a, b = (workload.batch(3, 4, torch.device("cpu")) for _ in range(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and int(a[1].max()) < 10
    # FLOPs counted by torch on a meta copy: 2 per multiply-add, forward and the two backward
    # matmuls (the first conv's input needs no gradient), plus the head's few.
    model = workload.build_model()
    convs = 2 * 16 * 16 * (2 * 3 * 32 * 9 + 3 * 8 * 32 * 32 * 9)
    assert convs < workload.flops_per_item(model) < convs + 3 * 2 * 32 * 10 + 1
    assert [type(b).__name__ for b in workload.blocks(model)] == ["BasicBlock"] * 4
    not_used = workload.inapplicable()
    assert {"attention", "fused_kernels"} <= set(not_used) and "checkpointing" not in not_used
    _, losses = train(workload, batch_size=4)
    assert all(torch.isfinite(torch.tensor(losses)))


def _importable(package: str) -> bool:
    try:  # installed is not enough: PyPI's torchvision fails to import beside a CPU-only torch
        __import__(package)
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _importable("torchvision"), reason="torchvision does not import here")
def test_a_torchvision_model_by_name():
    workload = load("torchvision:resnet18")
    assert workload.name == "torchvision:resnet18" and workload.item_name == "images"
    assert workload.batch(0, 2, torch.device("cpu"))[0].shape == (2, 3, 224, 224)
    assert len(workload.blocks(workload.build_model())) == 8  # the BasicBlocks of all 4 stages
    with pytest.raises(WorkloadError, match="no classification model 'resnt18'.*close: resnet18"):
        load("torchvision:resnt18")


@pytest.mark.skipif(not _importable("timm"), reason="timm does not import here")
def test_a_timm_model_by_name():
    workload = load("timm:resnet18")
    assert workload.name == "timm:resnet18" and workload.item_name == "images"
    assert workload.batch(0, 2, torch.device("cpu"))[0].shape == (2, 3, 224, 224)
    with pytest.raises(WorkloadError, match="timm .* has no model 'nope_net'"):
        load("timm:nope_net")


def test_a_trial_on_an_hf_workload_is_labelled_without_what_the_model_does_not_use(tmp_path):
    from strategies.config import TuneConfig
    from tuner_tui.engine.trial import Trainer

    workload = load(f"hf:{write_config(tmp_path / 'tiny', CONFIGS['llama'])}", seq_len=16)
    assert workload.describe()["inapplicable"]["fused_kernels=gelu"] == "no tanh-approximated GELU"
    config = TuneConfig.from_dict({"batch_size": 2, "fused_kernels": ["gelu"]})
    trainer = Trainer(workload, config, "cpu", warmup_steps=1)
    trainer.build()
    trainer.step()
    trainer.step()
    trainer.finish()
    result = trainer.result()
    trainer.close()
    assert result.status == "ok" and result.measured_steps == 1
    assert result.label == "fp32 + batch 2" and result.item_name == "tokens"

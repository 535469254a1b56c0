"""Strategies on models that are not ours: Hugging Face causal LMs built from a config, a
convolutional network, a plain MLP (the workloads in examples/)."""

import json

import pytest
import torch

import strategies
from strategies import TuneConfig
from tuner_tui.engine.trial import Trainer

pytest.importorskip("transformers")
from examples import hf_causal_lm, plain_model, vision_cnn  # noqa: E402


def _trainer(workload, config: dict, steps=3, reference=()):
    t = Trainer(workload, TuneConfig.from_dict(config), "cpu", warmup_steps=1,
                reference_losses=reference)
    t.build()
    for _ in range(steps):
        t.step()
    t.finish()
    return t


@pytest.mark.parametrize(
    "factory, blocks",
    [(hf_causal_lm.llama, 2), (hf_causal_lm.gpt2, 2), (vision_cnn.resnet, 4), (plain_model.mlp, 6)],
)
def test_checkpointing_and_precision_on_foreign_models_keep_the_loss(factory, blocks):
    w = factory(device="cpu")
    ref = _trainer(w, {"batch_size": 4})
    losses = tuple(r.loss for r in ref.records)
    t = _trainer(w, {"precision": "bf16", "checkpointing": "full", "optimizer": "foreach",
                     "batch_size": 4}, reference=losses)
    assert t.report["checkpointing"]["blocks"] == blocks
    ok, worst, tol = t.loss_check()
    assert ok, (worst, tol)
    assert t.result().status == "ok"


def test_every_n_and_selective_checkpointing_on_hugging_face_llama():
    w = hf_causal_lm.llama(device="cpu")
    ref = tuple(r.loss for r in _trainer(w, {}).records)
    for policy in ("every-n", "selective"):
        t = _trainer(w, {"checkpointing": policy, "checkpoint_every": 2}, reference=ref)
        assert t.loss_check()[0], policy
        assert t.report["checkpointing"]["blocks"] == (1 if policy == "every-n" else 2)


@pytest.fixture
def interpreted_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import gputune_kernels

    if not gputune_kernels.available()[0]:
        pytest.skip("Triton kernels cannot run here")


@pytest.mark.parametrize(
    "factory, swapped, left",
    [
        # Llama's gated MLPs by their parts, GPT-2's NewGELUActivation by name.
        (hf_causal_lm.llama, {"rms_norm": 5, "layer_norm": 0, "gelu": 0, "swiglu": 2}, {}),
        (hf_causal_lm.gpt2, {"rms_norm": 0, "layer_norm": 5, "gelu": 2, "swiglu": 0}, {}),
        (plain_model.mlp, {"rms_norm": 0, "layer_norm": 6, "gelu": 6, "swiglu": 0}, {}),
    ],
)
def test_kernel_swap_reports_what_it_swapped_and_what_it_left(interpreted_kernels, factory,
                                                               swapped, left):
    w = factory(device="cpu")
    # One step each: the Triton interpreter is slow, and one step's loss already compares the
    # swapped forward pass with the reference's.
    ref = tuple(r.loss for r in _trainer(w, {"batch_size": 2}, steps=1).records)
    t = _trainer(w, {"fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu"],
                     "batch_size": 2}, steps=1, reference=ref)
    assert t.report["fused_kernels"] == swapped
    assert t.report["fused_kernels_left"] == left
    ok, worst, _ = t.loss_check()
    assert ok, worst


def test_only_gated_silu_mlps_are_taken_for_swiglu():
    from torch import nn

    from strategies.fused_kernels import FusedGatedMLP, replacement_for

    class LlamaLikeMLP(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (nn.Linear(4, 8), nn.Linear(4, 8),
                                                            nn.Linear(8, 4))
            self.act_fn = act

    mlp = LlamaLikeMLP(nn.SiLU())
    found = replacement_for(mlp, {"swiglu"})
    assert found is not None and found[0] == "swiglu" and isinstance(found[1], FusedGatedMLP)
    assert found[1].down_proj is mlp.down_proj  # the same parameters, not copies
    assert replacement_for(LlamaLikeMLP(nn.GELU()), {"swiglu"}) is None  # GeGLU: not ours
    assert replacement_for(LlamaLikeMLP(nn.SiLU()), {"rms_norm"}) is None  # not asked for


def test_a_layer_norm_with_a_forward_of_its_own_is_left_alone():
    """torchvision's ConvNeXt normalizes (N, C, H, W) maps with a LayerNorm subclass that moves
    the channels last and back in its forward; swapped for the fused layer norm, a held-out
    ConvNeXt-Tiny's trial crashed on the H100 (weight of C against a last dim of W)."""
    from torch import nn

    from strategies.fused_kernels import FusedLayerNorm, replacement_for, unswapped_candidates

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):
            x = x.permute(0, 2, 3, 1)
            x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias,
                                         self.eps)
            return x.permute(0, 3, 1, 2)

    assert replacement_for(LayerNorm2d(8), {"layer_norm"}) is None
    assert replacement_for(nn.LayerNorm([4, 8]), {"layer_norm"}) is None  # over two dims
    found = replacement_for(nn.LayerNorm(8), {"layer_norm"})
    assert found is not None and isinstance(found[1], FusedLayerNorm)
    assert unswapped_candidates(nn.Sequential(LayerNorm2d(8))) == {"LayerNorm2d": 1}


def test_an_rms_norm_that_scales_by_one_plus_its_weight_is_left_alone():
    """Gemma's RMSNorm multiplies by 1 + weight, its weight starting at zero: taken by its name
    for the fused RMSNorm (x / rms(x) * weight), its blocks would have output zeros. A module
    named like an RMSNorm is swapped only where its own forward gives what the kernel does."""
    from torch import nn
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from strategies.fused_kernels import FusedRMSNorm, replacement_for

    gemma, llama = GemmaRMSNorm(8), LlamaRMSNorm(8)
    with torch.no_grad():
        llama.weight.uniform_(0.5, 1.5)  # (trained weights, not the ones it starts with)
    before = torch.get_rng_state()
    assert replacement_for(gemma, {"rms_norm"}) is None
    found = replacement_for(llama, {"rms_norm"})
    assert found is not None and isinstance(found[1], FusedRMSNorm)
    assert replacement_for(llama.to(torch.bfloat16), {"rms_norm"}) is not None
    assert replacement_for(nn.RMSNorm(8), {"rms_norm"}) is not None
    assert torch.equal(torch.get_rng_state(), before)  # the probe leaves the model's seed alone
    # The workload's facts are read from a copy on the meta device: told apart there too.
    with torch.device("meta"):
        on_meta = (GemmaRMSNorm(8), LlamaRMSNorm(8))
    assert replacement_for(on_meta[0], {"rms_norm"}) is None
    assert replacement_for(on_meta[1], {"rms_norm"}) is not None


def test_levers_keep_the_loss_on_architectures_gputune_was_not_written_for():
    """benchmarks/hf_architectures.py (24 architectures: docs/guide.md) on four that
    once went wrong or differ most: Gemma's norm of 1 + weight, Gemma 2 without SDPA, GPT-NeoX,
    a mixture of experts."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "benchmarks/hf_architectures.py", "gemma", "gemma2",
                           "gpt_neox", "mixtral"], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "24 of 24 ok" in done.stdout, done.stdout + done.stderr


def test_exported_file_applies_in_the_users_own_loop_on_hugging_face(tmp_path):
    w = hf_causal_lm.gpt2(device="cpu")
    config = TuneConfig.from_dict({"precision": "bf16", "checkpointing": "selective",
                                   "optimizer": "foreach", "grad_clip": 0.5})
    strategies.save(config, tmp_path / "gputune.toml")
    torch.manual_seed(0)
    model = w.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # The user's own loop, with the file applied:
    tuned = strategies.apply(strategies.load(tmp_path / "gputune.toml"), model, optimizer)
    losses = []
    for step in range(6):
        batch = w.batch(step, 8, torch.device("cpu"))
        with tuned.autocast():
            loss = w.loss(tuned.model, batch)
        tuned.step(loss)
        losses.append(loss.item())
    assert tuned.report["checkpointing"]["blocks"] == 2
    assert tuned.report["precision"]["autocast"] == "bfloat16"
    assert losses[-1] < losses[0], losses


def test_hugging_face_workload_runs_in_bench(gputune, tmp_path):
    # One row, in one worker: fp32 with SDPA computes the reference itself (no second worker for
    # it); bf16 and the other strategies on these models: the tests above, in this process.
    config = tmp_path / "sdpa.toml"
    config.write_text("[config]\nattention = 'sdpa'\n")
    proc = gputune("bench", "--device", "cpu", "--workload", "examples.hf_causal_lm:llama",
                   "--config", str(config), "--steps", "2", "--warmup", "1",
                   "--json", str(tmp_path / "b.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hf-llama-tiny" in proc.stdout
    (row,) = json.loads((tmp_path / "b.json").read_text())["results"]
    assert row["status"] == "ok" and row["label"] == "fp32 + sdpa", row

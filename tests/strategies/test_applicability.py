"""What changes nothing in a model: found by each strategy, left out of labels and of a
preset's rungs, read back from a worker's description."""

import torch
from torch import nn

import strategies

from strategies.applicability import distinct, inapplicable_options, split_key
from strategies.compose import inapplicable
from strategies.config import TuneConfig
from tuner_tui.engine.bench import ladder
from tuner_tui.engine.workloads import load


class TwoLayerCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.convs(x).mean(dim=(2, 3)))


def on_meta(build):
    with torch.device("meta"):
        return build()


def test_a_cnn_uses_no_attention_kernels_float8_or_blocks():
    found = inapplicable(on_meta(TwoLayerCNN))
    assert set(found) == {"attention", "fused_kernels", "kernels_with_compile", "fp8",
                          "fp8_layers", "checkpointing", "checkpoint_every",
                          "compile_scope=block"}
    assert found["checkpointing"].startswith("no repeated blocks")


class Stage(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x):
        return x + self.conv(x)


class TwoStageCNN(nn.Module):
    """A ResNet's shape: stages of blocks that differ in width from stage to stage."""

    def __init__(self, widths=(8, 16)):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3)
        self.stages = nn.ModuleList(nn.Sequential(Stage(w), Stage(w)) for w in widths)
        self.widen = nn.Conv2d(widths[0], widths[-1], 1)

    def blocks(self):
        return [block for stage in self.stages for block in stage]


def test_blocks_of_several_shapes_are_compiled_whole_and_blocks_of_one_per_block():
    model = TwoStageCNN()
    found = inapplicable(model, model.blocks())
    assert "2 shapes" in found["compile_scope=block"] and "checkpointing" not in found
    config = TuneConfig.from_dict({"compile_mode": "default", "compile_scope": "block"})
    run = strategies.apply(config, model, device_type="cpu", blocks=model.blocks())
    assert run.report["compile"]["scope"] == "model" and run.report["compile"]["compiled"] == 1
    alike = TwoStageCNN(widths=(8, 8))
    assert "compile_scope=block" not in inapplicable(alike, alike.blocks())
    run = strategies.apply(config, alike, device_type="cpu", blocks=alike.blocks())
    assert run.report["compile"] == {"compiled": 4, "scope": "block", "mode": None,
                                     "fullgraph": False}


def test_the_built_in_models_lack_only_the_other_family_s_kernels():
    gpt = inapplicable(on_meta(load("gpt2-tiny").build_model))
    llama = inapplicable(on_meta(load("llama-tiny").build_model))
    assert set(gpt) == {"fused_kernels=rms_norm", "fused_kernels=swiglu"}
    assert set(llama) == {"fused_kernels=layer_norm", "fused_kernels=gelu"}


def test_labels_leave_out_what_the_model_does_not_use():
    skip = inapplicable(on_meta(TwoLayerCNN))
    config = TuneConfig.from_dict({"precision": "bf16", "attention": "sdpa",
                                   "fused_kernels": ["gelu"], "optimizer": "fused"})
    assert config.label() == "bf16 + sdpa + kernels(gelu) + fused AdamW"
    assert config.label(skip=skip) == "bf16 + fused AdamW"
    assert config.label(skip={"fused_kernels=gelu": "no tanh GELU"}) == "bf16 + sdpa + fused AdamW"
    partly = config.replace(fused_kernels=("gelu", "rms_norm"))
    assert partly.without({"fused_kernels=gelu"}).fused_kernels == ("rms_norm",)


def test_a_preset_s_rungs_that_only_add_what_the_model_does_not_use_are_dropped():
    skip = inapplicable(on_meta(TwoLayerCNN))
    kept, lines = distinct(ladder(), skip)
    labels = [c.label(skip=skip) for c in kept]
    assert len(labels) == len(set(labels)) and "bf16" in labels
    assert len(kept) + len(lines) == len(ladder())
    assert lines[0].startswith("bf16 + sdpa: the same as bf16 for this model (attention: no ")
    assert distinct(ladder(), {}) == (ladder(), [])


def test_a_preset_s_rungs_an_override_made_equal_run_once():
    """`gputune bench --set precision=bf16` turns the ladder's fp32 and tf32 rungs into its
    bf16 rung: measured once, each other one named, not three identical rows."""
    bf16 = [c.replace(precision="bf16") for c in ladder()]
    kept, lines = distinct(bf16, {})
    assert len(kept) == len(set(kept)) and len(kept) + len(lines) == len(bf16)
    assert len(lines) >= 2 and all(line.endswith("(the same configuration)") for line in lines)
    assert lines[0] == "bf16: the same as bf16 (the same configuration)"


def test_the_description_is_read_back_keeping_only_known_options():
    described = {"inapplicable": {"attention": "why", "fused_kernels=gelu": "why",
                                  "fused_kernels=nope": "?", "colour": "?", "fp8": 3}}
    assert inapplicable_options(described) == {"attention": "why", "fused_kernels=gelu": "why"}
    assert inapplicable_options({}) == {} and inapplicable_options({"inapplicable": [1]}) == {}
    assert split_key("fused_kernels=gelu") == ("fused_kernels", "gelu")

"""What changes nothing in a model: found by each strategy, left out of labels and of a
preset's rungs, read back from a worker's description."""

import torch
from torch import nn

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


def test_the_description_is_read_back_keeping_only_known_options():
    described = {"inapplicable": {"attention": "why", "fused_kernels=gelu": "why",
                                  "fused_kernels=nope": "?", "colour": "?", "fp8": 3}}
    assert inapplicable_options(described) == {"attention": "why", "fused_kernels=gelu": "why"}
    assert inapplicable_options({}) == {} and inapplicable_options({"inapplicable": [1]}) == {}
    assert split_key("fused_kernels=gelu") == ("fused_kernels", "gelu")

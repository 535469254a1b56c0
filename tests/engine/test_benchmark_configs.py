"""Every configuration file the GPU scripts pass (`benchmarks/configs/`) reads as a valid
configuration: a typo there would surface only on the device, minutes into a call."""

import re
from pathlib import Path

import pytest

from strategies.config import read

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "benchmarks/configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_benchmark_configuration_reads(path):
    config = read(path).config
    assert config.label()


def test_the_scripts_name_only_configurations_that_exist():
    root = Path(__file__).resolve().parents[2]
    for script in (root / "benchmarks").glob("*.sh"):
        text = script.read_text()
        # (a section may write its own configurations first: `> $c/NAME.toml`)
        names = {p.name for p in CONFIGS} | set(re.findall(r">\s*\$c/(\S+\.toml)", text))
        for word in text.replace("\\", " ").split():
            if word.startswith("$c/") and word.endswith(".toml"):
                assert word[3:] in names, (script.name, word)


def test_the_hand_recipe_accumulates_micro_batches_to_the_whole_batch_loss():
    # benchmarks/hand_recipe.py --micro-batch: the anchor that fits a budget the whole batch
    # misses must train on the same mean loss, split as a user splits by hand.
    import importlib.util

    import torch

    from tuner_tui.engine import workloads

    path = Path(__file__).resolve().parents[2] / "benchmarks/hand_recipe.py"
    spec = importlib.util.spec_from_file_location("hand_recipe", path)
    hand_recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hand_recipe)
    split = hand_recipe.split

    workload = workloads.load("llama-tiny", seed=0, device="cpu")
    model = workload.build_model()
    batch = workload.batch(0, 4, torch.device("cpu"))
    with torch.no_grad():
        whole = workload.loss(model, batch)
        for parts in (2, 4):
            pieces = split(batch, parts)
            assert len(pieces) == parts
            mean = sum(workload.loss(model, piece) for piece in pieces) / parts
            assert torch.allclose(mean, whole, rtol=1e-5)

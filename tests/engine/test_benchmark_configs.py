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

"""The layers' import rules: the dashboard and the torch-free engine parts import no torch; the
engine and strategies import no textual."""

import subprocess
import sys

import pytest


def _modules_after_import(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import strategies",
        "import strategies.registry, strategies.config",
        "import tuner_tui.engine.protocol, tuner_tui.engine.client, tuner_tui.engine.bench",
        "import tuner_tui.engine.profile, tuner_tui.engine.table, tuner_tui.engine.search",
        "import tuner_tui.cli",
        "import tuner_tui.app",
    ],
)
def test_imports_no_torch(statement):
    assert "torch" not in _modules_after_import(statement)


@pytest.mark.parametrize(
    "statement",
    [
        "import strategies.compose, strategies.fused_kernels, strategies.checkpointing",
        "import tuner_tui.engine.worker, tuner_tui.engine.trial, tuner_tui.engine.bench",
        "import tuner_tui.engine.profiler, tuner_tui.engine.profile",
        "import gputune_kernels",
    ],
)
def test_engine_imports_no_textual(statement):
    assert "textual" not in _modules_after_import(statement)

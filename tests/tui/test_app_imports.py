"""The dashboard and the torch-free engine modules import no torch (each in a fresh process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = (
    "tuner_tui.app",
    "tuner_tui.app.app",
    "tuner_tui.engine.protocol",
    "tuner_tui.engine.client",
    "tuner_tui.engine.telemetry",
    "strategies.registry",
    "strategies.config",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_imports_no_torch(module):
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_app_widgets_import_no_torch():
    code = (
        "import sys, pkgutil, importlib, tuner_tui.app.widgets as w, tuner_tui.app.screens as s\n"
        "for pkg in (w, s):\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(pkg.__name__ + '.' + info.name)\n"
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

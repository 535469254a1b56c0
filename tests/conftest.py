"""Session-wide test setup.

Without CUDA, the Triton kernels run on the CPU through Triton's interpreter. TRITON_INTERPRET
must be set before triton is first imported anywhere in the session (any test module may import
it indirectly, e.g. through transformers), so it is set here, at the root, before collection.
Tests marked `gpu` are skipped where CUDA is absent.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# One thread per process: the suite runs two tests at a time (pytest-xdist, `-n 2` in
# pyproject.toml, sized for the 2-core CI machine), and each test's workers beside the other's
# would oversubscribe the cores with torch's default of a thread per core. Set before torch is
# imported, here and (inherited) in every subprocess.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

# Subprocesses of the tests (the CLI, its workers) import this checkout as pytest does, with
# pythonpath/ giving kernels/ its installed name, gputune_kernels, where gputune is not installed.
_ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_ROOT), str(_ROOT / "pythonpath")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One Inductor cache for every worker the session starts, so a model compiled by one test is
# not compiled from scratch again by the next (about 24 s a compile on the 2-core CI machine).
# Each test still gets a fresh result store (GPUTUNE_HOME); the tests of gputune's own cache
# folder unset this. A fresh folder per session: no artifact of an earlier run is reused. Made by
# the process that starts the session (xdist's workers inherit it) and removed when it exits.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_cache = tempfile.mkdtemp(prefix="gputune-test-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache
    atexit.register(shutil.rmtree, _inductor_cache, True)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

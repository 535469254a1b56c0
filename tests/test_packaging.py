"""Packaging: the Python versions pyproject allows, and gputune installed beside Hugging Face's
`kernels` package (our `kernels/` folder installs as `gputune_kernels`)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TORCH_FREE = [
    "gputune", "strategies", "strategies.registry", "strategies.config", "strategies.exports", "tuner_tui.format",
    "tuner_tui.engine.protocol", "tuner_tui.engine.client", "tuner_tui.engine.bench",
    "tuner_tui.engine.search", "tuner_tui.cli", "tuner_tui.app.session", "tuner_tui.app.controller",
]


def _oldest_allowed() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip())
    assert match, f"requires-python should be a lower bound, not {spec!r}"
    return int(match.group(1)), int(match.group(2))


def _interpreter(version: tuple[int, int]) -> str | None:
    if sys.version_info[:2] == version:
        return sys.executable
    name = "python{}.{}".format(*version)
    found = shutil.which(name)
    if found:
        return found
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/{}.{}.*/bin/python".format(*version))))
    return pyenv[-1] if pyenv else None


def test_the_torch_free_parts_import_on_the_oldest_python_allowed():
    version = _oldest_allowed()
    python = _interpreter(version)
    if python is None:
        pytest.skip("no Python {}.{} on this machine".format(*version))
    # Only the package's own folder on the path: at import time these modules need the
    # standard library of that version and nothing else.
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'torch' not in sys.modules\n"
        "print(sys.version_info[:2])\n"
    )
    proc = subprocess.run([python, "-S", "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(version)


def test_the_checkout_imports_gputune_kernels_as_the_gpu_scripts_do(tmp_path):
    """The GPU scripts run from the checkout without installing it (benchmarks/gpu_env.sh)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OUT=str(tmp_path), TRITON_INTERPRET="1")
    code = "import gputune_kernels, strategies.fused_kernels; print(gputune_kernels.__file__)"
    proc = subprocess.run(
        ["bash", "-c", f". benchmarks/gpu_env.sh && {sys.executable} -c '{code}'"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (ROOT / "kernels" / "__init__.py").resolve()


def test_without_hugging_faces_kernels_the_folder_reads_as_a_shadow_not_an_install():
    """From the checkout's root where Hugging Face's `kernels` is not installed (the H200's
    transformers 5.17): transformers imports the name it finds to read its version, and takes a
    module without a version or a file for a folder shadowing it; an ImportError there had
    ended its import, and every Hugging Face model's run with it."""
    code = (
        "import importlib, importlib.util\n"
        "assert importlib.util.find_spec('kernels') is not None\n"  # the folder, by its name
        "m = importlib.import_module('kernels')\n"
        "assert getattr(m, '__version__', 'N/A') == 'N/A' and getattr(m, '__file__', 0) is None\n"
        "try:\n"
        "    m.use_kernel_forward_from_hub\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    # -S: without site-packages, where Hugging Face's package would be
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    assert "kernels package is not installed" in proc.stdout


@pytest.mark.slow
def test_gputune_installs_beside_hugging_faces_kernels(tmp_path):
    """Both import by their own names in one environment, and both work."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # A venv made inside CI's venv sees the base interpreter's packages, not CI's: add CI's.
    outer = subprocess.run([sys.executable, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                           capture_output=True, text=True, check=True).stdout
    inner = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "outer-environment.pth").write_text(outer)
    # As a user installs: without the checkout on PYTHONPATH, where our kernels/ folder would
    # shadow HF's (its setuptools plugin, kernels.locking, runs during our build).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
    got = subprocess.run(pip + ["kernels==0.17.2"], capture_output=True, text=True, env=env)
    if got.returncode != 0 and "No matching distribution" in got.stderr + got.stdout:
        pytest.skip("the package index cannot be reached: " + got.stderr.strip().splitlines()[-1])
    assert got.returncode == 0, got.stderr
    got = subprocess.run(pip + ["--no-build-isolation", "-e", str(ROOT)], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stdout + got.stderr

    code = (
        "import kernels, gputune_kernels, torch\n"
        "from kernels import use_kernel_forward_from_hub\n"
        "assert kernels.__version__ == '0.17.2', kernels.__version__\n"
        "@use_kernel_forward_from_hub('RMSNorm')\n"
        "class Norm(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
        "x = torch.randn(3, 17)\n"
        "ours = gputune_kernels.rms_norm(x, torch.ones(17), 1e-6)\n"
        "torch.testing.assert_close(ours, Norm()(x))\n"
        "import strategies.fused_kernels, tuner_tui.cli, gputune\n"
        "assert gputune.Workload.__module__ == 'tuner_tui.engine.workloads'\n"
        "print(kernels.__file__); print(gputune_kernels.__file__)\n"
    )
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    hf, ours = (Path(line) for line in proc.stdout.split())
    assert hf.is_relative_to(venv)
    assert ours.resolve() == (ROOT / "kernels" / "__init__.py").resolve()


def test_import_gputune_names_the_public_api():
    import gputune
    import strategies
    from strategies import exports

    assert gputune.apply is strategies.apply and gputune.load is strategies.load
    assert gputune.export is exports.write
    assert gputune.hf_training_arguments is exports.hf_training_arguments
    from tuner_tui.engine.workloads import Workload

    assert gputune.Workload is Workload
    assert set(gputune.__all__) <= set(dir(gputune)) | {"Workload"}


def test_setup_installs_the_gputune_package():
    # In a fresh interpreter: setuptools refuses to load after another test imported distutils.
    code = ("import runpy, setuptools\n"
            "declared = {}\n"
            "setuptools.setup = lambda **kwargs: declared.update(kwargs)\n"
            "runpy.run_path('setup.py')\n"
            "print(' '.join(declared['packages']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    packages = set(proc.stdout.split())
    assert {"gputune", "strategies", "tuner_tui", "tuner_tui.app", "gputune_kernels"} <= packages
    assert not any(p.startswith(("tests", "benchmarks", "examples")) for p in packages)

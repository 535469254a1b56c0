import subprocess
import sys
from pathlib import Path

import gputune_kernels

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_kernel_names_are_the_exported_functions():
    assert gputune_kernels.KERNEL_NAMES == (
        "softmax", "causal_softmax", "layer_norm", "rms_norm", "cross_entropy",
        "fused_linear_cross_entropy", "swiglu", "gelu_tanh",
    )
    for name in gputune_kernels.KERNEL_NAMES:
        assert callable(getattr(gputune_kernels, name)), name


def test_available_says_yes_here_with_a_reason():
    ok, reason = gputune_kernels.available()
    assert ok is True and reason


def test_available_says_why_not_without_cuda_or_interpreter():
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '0'; "
        "import torch; torch.cuda.is_available = lambda: False; "
        "import gputune_kernels; print(gputune_kernels.available())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    assert out.startswith("(False, 'no CUDA device")


def test_kernels_import_only_torch_and_triton():
    code = "import sys, gputune_kernels; print(sorted(m for m in ('strategies', 'tuner_tui', 'textual') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    assert out.strip() == "[]"


def test_ops_under_autocast_compute_in_the_input_dtype():
    import torch

    from kernel_testing import DEVICE

    x = torch.randn(5, 123, device=DEVICE)
    w = torch.randn(123, device=DEVICE)
    target = torch.randint(0, 123, (5,), device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert gputune_kernels.softmax(x).dtype == torch.float32
        assert gputune_kernels.rms_norm(x, w).dtype == torch.float32
        assert gputune_kernels.rms_norm(x.bfloat16(), w).dtype == torch.bfloat16
        assert gputune_kernels.cross_entropy(x.bfloat16(), target).dtype == torch.float32


def test_the_cli_checks_the_partial_sums_modes_the_kernels_take():
    # The CLI, which imports no torch, refuses a bad GPUTUNE_PARTIAL_SUMS before any run.
    from gputune_kernels import _partial_sums
    from tuner_tui.engine import kernel_knobs

    assert kernel_knobs.PARTIAL_SUMS_MODES == _partial_sums.MODES

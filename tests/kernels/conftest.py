"""Kernel tests run on CUDA when present, else on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before any @triton.jit kernel is defined (at import of kernels),
so it is set here, at collection, when no CUDA device is present.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (real sizes); skipped without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned(monkeypatch):
    """Make torch.empty / torch.empty_like return NaN-filled (or -7 for ints) tensors.

    The launchers allocate their outputs with these, so an element a kernel fails to write
    stays NaN and fails the comparison.
    """
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-7)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))
    yield

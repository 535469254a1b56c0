"""Fixtures for the kernel tests. The session-wide setup (TRITON_INTERPRET without CUDA, the
skipping of `gpu` tests) is in tests/conftest.py."""

import pytest
import torch


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


@pytest.fixture(scope="session", autouse=True)
def native_nodes_built():
    """On a GPU, build the C++ autograd nodes before any test runs, so that every eager call
    with a gradient takes the node wherever it applies, from the first test on (a build still
    under way would send the first tests' calls the Python way)."""
    if torch.cuda.is_available():
        from gputune_kernels import _native

        _native.wait(timeout=900)
    yield

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

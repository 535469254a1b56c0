"""Shared pieces of the kernel tests: the device, tolerances, and comparison helpers."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

#: (dtype, atol, rtol) against a float64 reference computed from the same (rounded) inputs.
TOLERANCES = [
    (torch.float32, 1e-5, 1e-4),
    (torch.bfloat16, 2e-2, 2e-2),
    (torch.float16, 2e-3, 2e-3),
]

DTYPES = [t[0] for t in TOLERANCES]


def tol(dtype: torch.dtype) -> tuple[float, float]:
    for d, atol, rtol in TOLERANCES:
        if d == dtype:
            return atol, rtol
    raise KeyError(dtype)


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf that requires grad."""
    return t.detach().clone().requires_grad_(True)


def ref_leaf(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy of t (same rounded values) that requires grad."""
    return t.detach().to(torch.float64).clone().requires_grad_(True)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, scale: float = 1.0):
    atol, rtol = tol(dtype)
    assert actual is not None, f"{what}: no gradient"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(
        actual.detach().to(torch.float64), expected.detach().to(torch.float64),
        atol=atol * scale, rtol=rtol * scale, msg=lambda m: f"{what} ({dtype}): {m}",
    )


#: aten ops that allocate or make views: no kernel runs on the device for them.
_NO_DEVICE_WORK = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view", "aten::as_strided",
                   "aten::detach", "aten::alias", "aten::contiguous", "aten::slice"}


def device_work(monkeypatch, step) -> tuple[list[str], set[str]]:
    """(the Triton kernels `step` launches, the aten ops it runs that do device work).

    Launches are counted and replaced by a no-op (the outputs are garbage; only the count
    matters), so the profiler sees the launchers' own torch calls, not the interpreter's.
    """
    import triton.runtime.jit
    from torch.profiler import ProfilerActivity, profile

    from gputune_kernels import _native

    monkeypatch.setattr(_native, "ENABLED", False)  # the Python path's launches (a node's are C++)

    launched = []

    def launch(kernel, grid):
        return lambda *args, **kwargs: launched.append(getattr(kernel, "__name__", repr(kernel)))

    monkeypatch.setattr(triton.runtime.jit.KernelInterface, "__getitem__", launch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = {e.name for e in prof.events() if e.name.startswith("aten::")}
    return launched, ops - _NO_DEVICE_WORK

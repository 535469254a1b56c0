"""The C++ autograd nodes (_native): same results as the Python path, taken only where they apply.

On the GPU the nodes run the very kernels the Python path runs, on the same inputs, so their
outputs and gradients must be bitwise equal to it (and close to a float64 reference). Where a
node does not apply (a CPU tensor, a non-contiguous or unaligned input, one row, no gradient)
the Python path runs, and its own tests check it.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gputune_kernels
from gputune_kernels import _native
from kernel_testing import assert_close, leaf, ref_leaf


def test_a_cpu_call_takes_the_python_path_and_starts_no_build():
    x = torch.randn(4, 8, requires_grad=True)
    assert not _native.applies("gelu_tanh", x)
    if not torch.cuda.is_available():  # (on a GPU machine the session has built it)
        assert _native.status() == "not built" and _native._build_thread is None


def test_gputune_native_0_turns_the_nodes_off():
    code = "from gputune_kernels import _native; print(_native.status()); print(_native.wait())"
    env = dict(os.environ, GPUTUNE_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["off (GPUTUNE_NATIVE=0)"] * 2


def test_a_build_lock_left_by_a_stopped_build_is_cleared_and_a_fresh_one_kept(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    now = lock.stat().st_mtime
    assert not _native.clear_stale_lock(tmp_path, now=now + 60)  # a build under way
    assert lock.exists()
    assert _native.clear_stale_lock(tmp_path, now=now + _native.STALE_LOCK_S + 1)
    assert not lock.exists()
    assert not _native.clear_stale_lock(tmp_path)  # (no lock)
    # A fresh lock whose builder has ended (a tune stopped by Ctrl-C mid-build, run again).
    lock.write_text("")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    (tmp_path / _native.BUILDER).write_text(ended.stdout)
    assert _native.clear_stale_lock(tmp_path) and not lock.exists()
    lock.write_text("")
    (tmp_path / _native.BUILDER).write_text(str(os.getpid()))  # alive: still building
    assert not _native.clear_stale_lock(tmp_path) and lock.exists()


def test_the_build_clears_a_stale_lock_in_the_folder_it_builds_in(tmp_path, monkeypatch):
    # torch's own lock waits forever for a file that a worker stopped mid-build left behind.
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    seen = {}

    def load_inline(**kwargs):  # (the compile itself is the GPU suite's: here, where it runs)
        seen.update(kwargs, lock_left=(Path(kwargs["build_directory"]) / "lock").exists())
        raise RuntimeError("no build here")

    assert _native.build_folder("x") == tmp_path / "x"
    monkeypatch.setattr(cpp_extension, "load_inline", load_inline)
    monkeypatch.setattr(_native, "_status", "not built")
    stale = tmp_path / "stale"
    stale.mkdir()
    monkeypatch.setattr(_native, "build_folder", lambda name: stale)
    lock = stale / "lock"
    lock.write_text("")
    old = time.time() - _native.STALE_LOCK_S - 10
    os.utime(lock, (old, old))
    _native._build()
    assert seen["build_directory"] == str(stale) and seen["lock_left"] is False
    assert (stale / _native.BUILDER).read_text() == str(os.getpid())
    assert _native.status().startswith("unavailable: RuntimeError: no build here")


def test_a_build_waits_for_another_builder_and_sees_it_die(tmp_path):
    # torch's own wait looks only for the lock file to go: a builder stopped meanwhile (a
    # worker stopped at the search's end) kept every build waiting behind it.
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / "lock"
        lock.write_text("")
        (tmp_path / _native.BUILDER).write_text(str(builder.pid))
        started = time.monotonic()
        threading.Timer(1.0, builder.kill).start()
        _native.wait_for_builder(tmp_path, poll_s=0.05)
        assert 0.9 < time.monotonic() - started < 10 and not lock.exists()
    finally:
        builder.kill()
        builder.wait()
    # A builder that ends its build removes the lock: the wait ends with it.
    lock.write_text("")
    (tmp_path / _native.BUILDER).write_text(str(os.getpid()))
    threading.Timer(0.5, lock.unlink).start()
    _native.wait_for_builder(tmp_path, poll_s=0.05)
    assert not lock.exists()


# ---- on the GPU ---------------------------------------------------------------------------

OPS = {
    # name: (our call, float64 reference, makes the inputs: {name: tensor})
    "gelu_tanh": (
        lambda x: gputune_kernels.gelu_tanh(x),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda shape, dtype: {"x": torch.randn(shape, device="cuda").mul(3).to(dtype)},
    ),
    "swiglu": (
        lambda a, b: gputune_kernels.swiglu(a, b),
        lambda a, b: F.silu(a) * b,
        lambda shape, dtype: {"a": torch.randn(shape, device="cuda").mul(3).to(dtype),
                              "b": torch.randn(shape, device="cuda").to(dtype)},
    ),
    "rms_norm": (
        lambda x, w: gputune_kernels.rms_norm(x, w),
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
        lambda shape, dtype: {"x": torch.randn(shape, device="cuda").to(dtype),
                              "w": torch.randn(shape[-1], device="cuda").to(dtype)},
    ),
    "layer_norm": (
        lambda x, w, b: gputune_kernels.layer_norm(x, w, b),
        lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        lambda shape, dtype: {"x": torch.randn(shape, device="cuda").to(dtype),
                              "w": torch.randn(shape[-1], device="cuda").to(dtype),
                              "b": torch.randn(shape[-1], device="cuda").to(dtype)},
    ),
    "layer_norm, no bias": (
        lambda x, w: gputune_kernels.layer_norm(x, w),
        lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None, 1e-5),
        lambda shape, dtype: {"x": torch.randn(shape, device="cuda").to(dtype),
                              "w": torch.randn(shape[-1], device="cuda").to(dtype)},
    ),
}


@pytest.fixture
def native():
    status = _native.wait(timeout=900)
    assert status == "ready", status  # the GPU machines have a C++ compiler and ninja
    _native.set_enabled(True)
    yield
    _native.set_enabled(True)


def _poison_cuda_cache():
    """Leave NaN in the blocks the caching allocator holds free, so that an output element a
    node (which allocates with ATen, not torch.empty) fails to write stays NaN."""
    blocks = [torch.full((n,), float("nan"), device="cuda") for n in [2**18] * 16 + [2**26] * 4]
    del blocks


def _run(name, inputs, python: bool, grad=None):
    ours = OPS[name][0]
    leaves = {k: leaf(v) for k, v in inputs.items()}
    _native.set_enabled(not python)
    try:
        _poison_cuda_cache()
        y = ours(*leaves.values())
        g = torch.randn_like(y) if grad is None else grad
        y.backward(g)
    finally:
        _native.set_enabled(True)
    node = y.grad_fn.name()
    return y, {k: v.grad for k, v in leaves.items()}, g, node


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 123), (37, 781), (4, 6, 4096), (16, 768)])
@pytest.mark.parametrize("name", list(OPS))
def test_a_node_gives_the_python_paths_results_bit_for_bit(native, name, shape, dtype):
    torch.manual_seed(0)
    inputs = OPS[name][2](shape, dtype)
    y, grads, g, node = _run(name, inputs, python=False)
    assert "Node" in node, f"{name} did not take the C++ node: {node}"
    y_py, grads_py, _, node_py = _run(name, inputs, python=True, grad=g)
    assert "Node" not in node_py
    assert torch.equal(y, y_py), f"{name} output differs from the Python path"
    for k in grads:
        assert torch.equal(grads[k], grads_py[k]), f"{name} grad {k} differs from the Python path"
    # and both against float64
    refs = {k: ref_leaf(v) for k, v in inputs.items()}
    yr = OPS[name][1](*refs.values())
    yr.backward(g.to(torch.float64))
    assert_close(y, yr, dtype, f"{name} output")
    for k in grads:
        scale = 4.0 if k in ("w", "b") and name != "swiglu" else 1.0  # sums over rows
        assert_close(grads[k], refs[k].grad, dtype, f"{name} grad {k}", scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(OPS))
def test_a_node_takes_an_expanded_gradient_and_runs_on_the_callers_stream(native, name):
    torch.manual_seed(0)
    inputs = OPS[name][2]((64, 1000), torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        leaves = {k: leaf(v) for k, v in inputs.items()}
        y = OPS[name][0](*leaves.values())
        assert "Node" in y.grad_fn.name()
        y.sum().backward()  # the gradient arrives expanded, stride 0
    torch.cuda.current_stream().wait_stream(side)
    refs = {k: ref_leaf(v) for k, v in inputs.items()}
    OPS[name][1](*refs.values()).sum().backward()
    for k, v in leaves.items():
        scale = 4.0 if k in ("w", "b") and name != "swiglu" else 1.0  # sums over rows
        assert_close(v.grad, refs[k].grad, torch.bfloat16, f"{name} grad {k}", scale=scale)


@pytest.mark.gpu
def test_the_python_path_runs_where_a_node_does_not_apply(native):
    w = torch.randn(64, device="cuda", requires_grad=True)
    base = leaf(torch.randn(8 * 64 + 1, device="cuda"))
    cases = {
        "non-contiguous": leaf(torch.randn(64, 8, device="cuda")).t(),
        "unaligned": base[1:].view(8, 64),  # 4 bytes in
        "one row": leaf(torch.randn(1, 64, device="cuda")),
    }
    for what, x in cases.items():
        y = gputune_kernels.rms_norm(x, w)
        assert "Node" not in y.grad_fn.name(), what
        y.sum().backward()  # and the Python path's backward runs
    x = torch.randn(8, 64, device="cuda")  # no gradient to track: the implementation alone
    assert gputune_kernels.rms_norm(x, w.detach()).grad_fn is None


@pytest.mark.gpu
def test_after_one_call_the_cpp_entry_takes_the_next_and_declines_what_it_must_not_take(native):
    """The ops call the C++ entry first; it must return None wherever the Python path has to
    run (which raises the errors and handles tracing), and take the call where a node applies."""
    from torch.autograd import forward_ad as fwAD
    from torch.utils._python_dispatch import TorchDispatchMode

    entry = _native.entry
    x = leaf(torch.randn(8, 64, device="cuda", dtype=torch.bfloat16))
    w = leaf(torch.randn(64, device="cuda", dtype=torch.bfloat16))
    b = leaf(torch.randn(64, device="cuda", dtype=torch.bfloat16))
    gputune_kernels.layer_norm(x, w, b)  # registers this specialization and the stream
    gputune_kernels.gelu_tanh(x)
    y = entry.layer_norm(x, w, b, 1e-5)
    assert y is not None and y.grad_fn.name() == "LayerNormNode"
    assert entry.gelu_tanh(x).grad_fn.name() == "GeluNode"

    class Sub(torch.Tensor):
        pass

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    declined = {
        "a CPU tensor": lambda: entry.layer_norm(x.detach().cpu().requires_grad_(), w.cpu(), b.cpu(), 1e-5),
        "no gradient": lambda: entry.layer_norm(x.detach(), w.detach(), b.detach(), 1e-5),
        "non-contiguous": lambda: entry.gelu_tanh(leaf(torch.randn(64, 8, device="cuda", dtype=torch.bfloat16)).t()),
        "unaligned": lambda: entry.gelu_tanh(leaf(torch.randn(513, device="cuda", dtype=torch.bfloat16))[1:]),
        "one row": lambda: entry.layer_norm(x[:1], w, b, 1e-5),
        "a weight of another length": lambda: entry.layer_norm(x, w[:32], b, 1e-5),
        "a bias in another dtype": lambda: entry.layer_norm(x, w, b.float(), 1e-5),
        "no weight": lambda: entry.layer_norm(x, None, b, 1e-5),
        "an int eps": lambda: entry.layer_norm(x, w, b, 0),
        "a row length not registered": lambda: entry.layer_norm(
            leaf(torch.randn(8, 96, device="cuda", dtype=torch.bfloat16)), w.new_ones(96), None, 1e-5),
        "a tensor subclass": lambda: entry.gelu_tanh(x.as_subclass(Sub)),
        "swiglu of two dtypes": lambda: entry.swiglu(x, x.float()),
        "swiglu of two shapes": lambda: entry.swiglu(x, x.view(64, 8)),
        "not a tensor": lambda: entry.gelu_tanh([1.0, 2.0]),
    }
    for what, call in declined.items():
        assert call() is None, what
    with torch.no_grad():
        assert entry.gelu_tanh(x) is None, "under no_grad"
    with torch.inference_mode():
        assert entry.gelu_tanh(x) is None, "under inference_mode"
    with Passthrough():
        assert entry.gelu_tanh(x) is None, "under a dispatch mode"
    with fwAD.dual_level():
        assert entry.gelu_tanh(fwAD.make_dual(x.detach(), torch.ones_like(x))) is None, "a dual tensor"
    seen = []
    torch.func.vmap(lambda r: seen.append(entry.gelu_tanh(r)) or r)(x.detach())
    assert seen == [None], "under vmap"
    side = torch.cuda.Stream()  # a stream the entry has not seen: the Python path registers it
    with torch.cuda.stream(side):
        assert entry.gelu_tanh(x) is None
        assert gputune_kernels.gelu_tanh(x).grad_fn.name() == "GeluNode"
        assert entry.gelu_tanh(x) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("name, shape", [("layer_norm", (8192, 4096)), ("rms_norm", (8192, 4096)),
                                         ("gelu_tanh", (8192, 11008)), ("swiglu", (8192, 11008))])
def test_a_node_at_real_sizes(native, name, shape):
    torch.manual_seed(0)
    inputs = OPS[name][2](shape, torch.bfloat16)
    y, grads, g, node = _run(name, inputs, python=False)
    y_py, grads_py, _, _ = _run(name, inputs, python=True, grad=g)
    assert "Node" in node
    assert torch.equal(y, y_py) and all(torch.equal(grads[k], grads_py[k]) for k in grads)

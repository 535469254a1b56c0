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


HOLD_THE_BUILD_LOCK = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from gputune_kernels import _native\n"
    "with _native.build_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(60)\n"
)


def test_a_build_waits_for_another_builder_and_goes_on_when_it_is_killed(tmp_path):
    # torch's own wait looks only for its lock file to go: a builder killed mid-build (a
    # worker stopped at the search's end) kept every later build waiting behind it forever.
    builder = subprocess.Popen([sys.executable, "-c", HOLD_THE_BUILD_LOCK, str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline().strip() == "held"
        (tmp_path / "lock").write_text("")  # torch's, as the builder's load_inline made it
        started = time.monotonic()
        threading.Timer(1.0, builder.kill).start()
        with _native.build_lock(tmp_path):
            waited = time.monotonic() - started
            assert not (tmp_path / "lock").exists()  # left by a build that ended: cleared
    finally:
        builder.kill()
        builder.wait()
    assert 0.9 < waited < 30
    # Released on leaving: the next build takes it at once.
    started = time.monotonic()
    with _native.build_lock(tmp_path):
        assert time.monotonic() - started < 1


def test_the_build_runs_under_the_build_lock_in_the_folder_it_builds_in(tmp_path, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    seen = {}

    def load_inline(**kwargs):  # (the compile itself is the GPU suite's: here, where it runs)
        folder = Path(kwargs["build_directory"])
        seen.update(kwargs, lock_left=(folder / "lock").exists(),
                    others_wait=held_elsewhere(folder))
        raise RuntimeError("no build here")

    assert _native.build_folder("x") == tmp_path / "x"
    monkeypatch.setattr(cpp_extension, "load_inline", load_inline)
    monkeypatch.setattr(_native, "_status", "not built")
    folder = tmp_path / "stale"
    folder.mkdir()
    monkeypatch.setattr(_native, "build_folder", lambda name: folder)
    (folder / "lock").write_text("")  # a stopped build's
    _native._build()
    assert seen["build_directory"] == str(folder) and seen["lock_left"] is False
    assert seen["others_wait"], "another process took the build lock during the build"
    assert _native.status().startswith("unavailable: RuntimeError: no build here")
    assert not held_elsewhere(folder)  # released with the failed build


def test_a_file_system_without_locks_builds_under_torch_s_lock_alone(tmp_path, monkeypatch):
    import errno

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_native.fcntl, "flock", no_locks)
    (tmp_path / "lock").write_text("")  # (torch's: not known to be stale without the lock)
    with _native.build_lock(tmp_path):
        assert (tmp_path / "lock").exists()


def held_elsewhere(folder: Path) -> bool:
    """Whether another process finds the folder's build lock held (it cannot take it now)."""
    code = ("import fcntl, sys\n"
            "f = open(sys.argv[1], 'a')\n"
            "try:\n    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "except BlockingIOError:\n    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code, str(folder / _native.BUILD_LOCK)],
                          timeout=60)
    return done.returncode == 3


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

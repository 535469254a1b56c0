"""C++ autograd nodes for the eager calls of the small ops, built on first use.

A Python autograd.Function costs the host more per forward and backward than the GPU spends
on layer_norm, rms_norm, gelu_tanh or swiglu at training sizes (docs/kernels.md, "Host overhead"):
the Function's machinery, a Python backward on autograd's device thread, Python launches, the
Python checks before them. `_native.cpp` does the same work in C++, from one entry per op that
the op's Python function calls first: the entry checks the call, finds its compiled kernels
and the current stream, allocates with ATen, launches the Triton kernels through the driver and
records the node. It takes a call only where it matches the Python path exactly: eager, CUDA,
contiguous 16-byte aligned inputs, more than one row and column, 32-bit sizes, a gradient to
track, kernels registered for its specialization. Otherwise it returns None and the Python path
runs (it raises the errors and stays the reference); where that path finds the node applies,
it compiles the kernels and registers them (`run`), so the next such call stays in C++.

The extension is compiled with torch's cpp_extension (a C++ compiler and ninja; once per
source, torch and Python version, then cached; one process builds at a time, under a lock
that ends with its holder, `build_lock`)
in a background thread started by the first call that could use it; calls take the Python
path until it is ready. `wait()` blocks until the build ends and says how it went.
GPUTUNE_NATIVE=0 turns the nodes off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # (not POSIX)
    fcntl = None


ENABLED = os.environ.get("GPUTUNE_NATIVE", "1") != "0"

_SOURCE = Path(__file__).with_name("_native.cpp")
entry = None  # the built module, once ready (the ops call it first, where ENABLED)
_status = "off (GPUTUNE_NATIVE=0)" if not ENABLED else "not built"
_build_thread: threading.Thread | None = None
_lock = threading.Lock()


def status() -> str:
    """'ready', 'building', 'not built', 'off (...)' or 'unavailable: why'."""
    return _status


def extension():
    """The built extension, or None; the first call (on a machine with CUDA) starts the build."""
    if entry is None and _build_thread is None and ENABLED:
        _start_build()
    return entry


def wait(timeout: float | None = None) -> str:
    """Start the build if need be, wait for it to end, and return the status."""
    extension()
    thread = _build_thread
    if thread is not None:
        thread.join(timeout)
    return _status


def set_enabled(enabled: bool) -> None:
    """Turn the nodes on or off in this process (the benchmark times both)."""
    global ENABLED, _status
    ENABLED = enabled
    if not enabled:
        _status = "off (set_enabled(False))"
    elif _status.startswith("off"):
        _status = "ready" if entry is not None else "not built"


def _start_build() -> None:
    global _build_thread, _status
    with _lock:
        if _build_thread is not None:
            return
        _status = "building"
        _build_thread = threading.Thread(target=_build, name="gputune-native-build", daemon=True)
        _build_thread.start()


BUILD_LOCK = "gputune.build.lock"
"""The file whose advisory lock (flock) every gputune build of the folder holds while it builds.

torch's own build lock (a `lock` file that the first builder creates and removes when its
build ends) is left behind by a build stopped in the middle (a worker stopped at the time
budget's end, Ctrl-C, the search's end stopping the build beside the trials), and torch's own
wait in every later build then waits for it forever. The kernel releases a flock when its
holder dies, however it dies: holding one while it builds, a build waits for any other to end
or die, and under it any torch lock in the folder was left by a build that has ended."""


@contextlib.contextmanager
def build_lock(folder: Path):
    """Hold the folder's build lock (waiting for another build's end), with torch's lock that
    an ended build left removed."""
    with open(folder / BUILD_LOCK, "a") as held:  # (closing it releases the lock)
        try:
            if fcntl is not None:  # (POSIX)
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                (folder / "lock").unlink(missing_ok=True)
        except OSError:  # (a file system without locks, an NFS mount's nolock): torch's alone
            pass
        yield


def build_folder(name: str) -> Path:
    """Where torch builds the extension: its own default root (or $TORCH_EXTENSIONS_DIR)."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name


def _build() -> None:
    global entry, _status
    try:
        from torch.utils.cpp_extension import load_inline

        source = _SOURCE.read_text()
        # (one folder per source, torch and Python: torch's own default root names the latter)
        digest = hashlib.sha1((source + torch.__version__ + sys.version).encode()).hexdigest()[:12]
        name = f"gputune_native_{digest}"
        folder = build_folder(name)
        folder.mkdir(parents=True, exist_ok=True)
        with build_lock(folder):
            module = load_inline(
                name=name, cpp_sources=[source], extra_cflags=["-O2"],
                extra_ldflags=["-ldl"], verbose=False, build_directory=str(folder),
            )
        if not module.find_driver():
            _status = "unavailable: no libcuda.so.1 with the launch and context functions"
            return
        entry = module
        _status = "ready" if ENABLED else _status
    except Exception as exc:  # no compiler, no ninja, a build error: the Python path stays
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _status = f"unavailable: {type(exc).__name__}: {first}"[:300]


def applies(op: str, *args) -> bool:
    """True when a node can take this call of `op` (its arguments as the op's C++ entry takes
    them): the extension is ready and enabled, the call is eager, and the entry's checks pass
    (the one place they are written). The first CUDA call starts the build."""
    if torch.compiler.is_compiling():
        return False
    if entry is None or not ENABLED:
        if entry is None and _build_thread is None and ENABLED and args[0].is_cuda:
            _start_build()
        return False
    return entry.takes(op, args)


def run(op: str, kernels: list[int], *args):
    """Register the kernels of this call's specialization and the current stream with the C++
    entries, then run the call there: its output, or None where the entry declines it."""
    stream = torch.cuda.current_stream(args[0].device)
    if not entry.register(op, args, kernels, stream.stream_id, stream.cuda_stream):
        return None
    return getattr(entry, op)(*args)


def int_class(n: int) -> int:
    """How Triton specializes an int of a kernel (16: a multiple of 16, else 0); callers send
    1 and sizes past 32 bits the Python way."""
    return 16 if n % 16 == 0 else 0


def compiled(kernel, kinds: str, *args, **kwargs) -> tuple[int, int, int] | None:
    """(CUfunction, warps, shared memory) of `kernel` compiled for these arguments (dtypes for
    tensors, as Triton's warmup takes them), or None where it is not what the node passes:
    `kinds` lists its parameters, p a pointer, i an int32, f a float32."""
    k = kernel.warmup(*args, grid=(1,), **kwargs)
    k._init_handles()
    meta = k.metadata
    if (
        getattr(meta, "num_ctas", 1) != 1
        or getattr(meta, "global_scratch_size", 0)
        or getattr(meta, "profile_scratch_size", 0)
        or getattr(meta, "launch_cooperative_grid", False)
        or getattr(meta, "launch_pdl", False)
    ):
        return None
    types = [t for t in k.src.signature.values() if t != "constexpr"]
    found = "".join("p" if t.startswith("*") else {"i32": "i", "fp32": "f"}.get(t, "?") for t in types)
    if found != kinds:
        return None
    return (int(k.function), int(meta.num_warps), int(meta.shared))


def kernel_list(*parts) -> list[int] | None:
    """The flat list a node takes: each kernel's three ints, then the sizes; None if a kernel
    cannot be launched by the node."""
    out: list[int] = []
    for part in parts:
        if part is None:
            return None
        out.extend(part if isinstance(part, tuple) else (part,))
    return out

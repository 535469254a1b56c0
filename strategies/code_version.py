"""A hash of the code that decides what a measurement measures: the kernels, the strategies,
the built-in workloads and the engine's trial and worker code. Stored results are keyed by it,
so a result measured by other code is never reused, and kernel timings are cached by it.
Torch-free; it finds the files without importing the packages."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

PACKAGES = {"kernels": "gputune_kernels", "strategies": "strategies",
            "tuner_tui.engine.workloads": "tuner_tui.engine.workloads"}
"""Each package's name in the hash and its import name (the `kernels/` folder imports as
`gputune_kernels`: `kernels` is Hugging Face's package, which transformers installs)."""
ENGINE_FILES = ("trial.py", "worker.py", "gradients.py", "reference.py", "mfu.py", "faults.py")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds, does not import (kernels imports torch)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def code_files() -> list[tuple[str, Path]]:
    """(name in the hash, path) of every file hashed, in a fixed order."""
    files = []
    for package, import_name in PACKAGES.items():
        root = _package_dir(import_name)
        if root is not None:
            files += [(f"{package}/{p.relative_to(root).as_posix()}", p)
                      for p in root.rglob("*") if p.suffix in (".py", ".cpp")]  # .cpp: the C++ nodes
    engine = _package_dir("tuner_tui.engine")
    if engine is not None:
        files += [(f"tuner_tui.engine/{name}", engine / name) for name in ENGINE_FILES]
    return sorted(files)


@functools.cache
def code_hash() -> str:
    """16 hex digits of a SHA-256 over the files' names and bytes; computed once per process."""
    digest = hashlib.sha256()
    for name, path in code_files():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]

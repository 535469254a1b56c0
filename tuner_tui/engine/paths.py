"""Where gputune keeps its files, and how it finds a user's workload module. Torch-free.

`gputune_home()` holds the result store and the torch.compile caches. The caches live in a
folder only this user can read or write: a compiled graph is code that the next run loads and
executes, so a cache in a shared, predictable folder (Inductor's default is under /tmp) would
let another user plant code in our runs.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from strategies.files import gputune_home

__all__ = ["gputune_home"]  # (re-exported: the engine's callers find it here)


def private_folder(path: Path) -> Path | None:
    """`path`, created with mode 0700 if missing, or made 0700 if it is ours and open to others;
    None if it cannot be made private (another user's folder, a symlink, not a folder)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        if stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(0o700)
    except OSError:
        return None
    return path


def compile_cache_environ() -> dict[str, str]:
    """Environment for a worker: one Inductor cache for every trial, bench and dashboard run of
    this user, in a private folder under the gputune home, with the FX graph and AOT autograd
    caches switched on explicitly. A variable the user already set is left alone; without a
    private folder, Inductor's own default is kept."""
    folder = private_folder(gputune_home() / "inductor")
    wanted = {
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    if folder is not None:
        wanted["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return {k: v for k, v in wanted.items() if k not in os.environ}


def module_exists(dotted: str) -> bool:
    """Whether `import dotted` would find a module, without running any of it: the finders are
    asked for each part in turn, with the parent package's search path, so a package's
    `__init__` is not executed here (the worker imports it, and reports its errors)."""
    parts = dotted.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    search_path: list[str] | None = None
    for i, part in enumerate(parts):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            found, locations = True, getattr(loaded, "__path__", None)
        else:
            found, locations = _find(name, search_path)
        if not found:
            return False
        if locations is None and i < len(parts) - 1:
            return False
        search_path = None if locations is None else list(locations)
    return True


def _find(name: str, search_path: list[str] | None) -> tuple[bool, list[str] | None]:
    """(found, the package's search path or None for a plain module)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, search_path)
        except Exception:  # e.g. a namespace package inside one that is not imported
            continue
        if spec is not None:
            return True, spec.submodule_search_locations
    # The path finder cannot describe a namespace package whose parent is not imported: look
    # on disk, as it would.
    part = name.rpartition(".")[2]
    folders = [os.path.join(d or ".", part) for d in (search_path or sys.path)]
    namespace = [f for f in folders if os.path.isdir(f)]
    return (True, namespace) if namespace else (False, None)

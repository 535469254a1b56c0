"""Writing files safely: every file gputune writes goes through `write_atomic`.

A reader (or a crash) never sees a half-written file: the text goes to a temporary file with an
unpredictable name in the target's folder, which then replaces the target in one rename. The
rename replaces a symlink at the target rather than writing through it, and an existing file
keeps its permission bits. An export also keeps the file it replaces (`keep_previous`).
Torch-free and free of tuner_tui, so `strategies.config.save` can use it as well as the engine
and the dashboard.
"""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path


class WriteError(Exception):
    """A file that cannot be written; the message is one line for the user."""


def gputune_home() -> Path:
    """`$GPUTUNE_HOME`, or ~/.cache/gputune: the result store, the compile caches and the
    kernel timings."""
    return Path(os.environ.get("GPUTUNE_HOME") or Path.home() / ".cache" / "gputune").expanduser()


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _default_mode() -> int:
    # What open() would give a new file: 0o666 less the umask (mkstemp's own mode is 0o600).
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def check_writable(path: str | os.PathLike, what: str = "") -> None:
    """Raise WriteError unless `path` can be written: its folder exists and takes a new file,
    and the path is not a folder. Called on command-line paths before any measurement, so
    that results are not lost to a typo after an hour of work. `what` prefixes the message,
    e.g. "--json"."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    folder = _folder(path)
    if path.is_dir():
        raise WriteError(f"{name} is a folder: give a file name, e.g. {path / 'results.json'}")
    if not folder.exists():
        raise WriteError(f"{name}: its folder does not exist")
    if not folder.is_dir():
        raise WriteError(f"{name}: {folder} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise WriteError(f"{name}: cannot write in folder {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8) to `path` in one rename; raise WriteError with one line."""
    path = Path(path)
    folder = _folder(path)
    if path.is_dir() and not path.is_symlink():
        raise WriteError(f"cannot write {path}: it is a folder")
    try:
        old = path.lstat()
    except OSError:
        old = None
    mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), _default_mode() if mode is None else mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return path


def keep_previous(path: str | os.PathLike, new: str | bytes) -> Path | None:
    """Copy the file at `path` to the first free name of `path.1`, `path.2`, ... before it is
    replaced, unless it already holds `new`: an export never replaces a file without keeping
    it. Returns the copy's path, or None when there was nothing to keep."""
    path = Path(path)
    new = new.encode("utf-8") if isinstance(new, str) else new
    try:
        old = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
    except (FileNotFoundError, IsADirectoryError):
        return None  # nothing to keep (a folder is refused by the write that follows)
    except OSError as exc:
        raise WriteError(f"cannot read {path} to keep it before replacing it: "
                         f"{exc.strerror or exc}") from None
    if old == new:
        return None
    while True:
        kept = kept_name(path)
        try:
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteError(f"cannot keep the previous {path} as {kept}: "
                             f"{exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as handle:
            handle.write(old)
        return kept


def kept_name(path: str | os.PathLike) -> Path:
    """The name `keep_previous` gives the file at `path` now: the first free `path.N`."""
    path = Path(path)
    return next(kept for n in itertools.count(1)
                if not os.path.lexists(kept := path.with_name(f"{path.name}.{n}")))

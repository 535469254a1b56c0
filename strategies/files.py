"""Reading and writing files safely. Torch-free and free of tuner_tui, so `strategies.config` can
use it as well as the engine and the dashboard.

Writing: every file gputune writes goes through `write_atomic`. A reader (or a crash) never sees
a half-written file: the text goes to a temporary file with an unpredictable name in the
target's folder, which then replaces the target in one rename. The rename replaces a symlink at
the target rather than writing through it; a target that is not a regular file (a device such
as /dev/null, a named pipe, a folder) is refused, never replaced; an existing file keeps its
permission bits. An export also keeps the file it replaces (`keep_previous`). `write_all`
writes several outputs, each whatever happens to the others.

Reading: every file a user hands gputune (`--config`, `--compare`, `--data`, the files in
`$GPUTUNE_HOME`) is opened by `open_regular`: a named pipe, a device or a folder is refused with
one line instead of blocking or being read without end, and `read_capped` bounds what it reads.
"""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from strategies.errors import ConfigError


class WriteError(Exception):
    """A file that cannot be written; the message is one line for the user."""


class ReadError(Exception):
    """A file that cannot be read; the message is one line for the user."""


def gputune_home() -> Path:
    """`$GPUTUNE_HOME`, or ~/.cache/gputune: the result store, the compile caches and the
    kernel timings."""
    return Path(os.environ.get("GPUTUNE_HOME") or Path.home() / ".cache" / "gputune").expanduser()


def kind_of(mode: int) -> str | None:
    """What a file of this st_mode is, for a message ("a named pipe (fifo)"); None for a
    regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (fifo)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _default_mode() -> int:
    # What open() would give a new file: 0o666 less the umask (mkstemp's own mode is 0o600).
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _not_regular(path: Path) -> str | None:
    """What stands at `path` if it is neither missing, nor a regular file, nor a symlink (which
    the rename replaces); None otherwise."""
    try:
        info = path.lstat()
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    return kind_of(info.st_mode)


# -- writing ----------------------------------------------------------------------------------
def check_writable(path: str | os.PathLike, what: str = "") -> None:
    """Raise WriteError unless `path` can be written: its folder exists and takes a new file,
    and nothing but a regular file (or a symlink, which is replaced) stands at the path. Called
    on command-line paths before any measurement, so that results are not lost to a typo after
    an hour of work. `what` prefixes the message, e.g. "--json"."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    folder = _folder(path)
    kind = _not_regular(path)
    if kind == "a folder":
        raise WriteError(f"{name} is a folder: give a file name, e.g. {path / 'results.json'}")
    if kind is not None:
        raise WriteError(f"{name} is {kind}, not a regular file: give the name of a file to "
                         "write")
    if not folder.exists():
        raise WriteError(f"{name}: its folder does not exist")
    if not folder.is_dir():
        raise WriteError(f"{name}: {folder} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        why = exc.strerror or exc
        raise WriteError(f"{name}: cannot write in folder {folder}: {why}") from None
    os.close(fd)
    os.unlink(probe)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8) to `path` in one rename; raise WriteError with one line."""
    path = Path(path)
    folder = _folder(path)
    kind = _not_regular(path)
    if kind is not None:
        raise WriteError(f"cannot write {path}: it is {kind}, not a regular file")
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


def write_all(writers: Iterable[tuple[str, Callable[[], object]]]) -> dict[str, str]:
    """Call every writer, whatever the others do: (what, write) pairs such as
    ("--json r.json", lambda: write_json(...)). Returns {what: why} for each output that was
    not written, `why` one line; empty when all were."""
    problems = {}
    for what, write in writers:
        try:
            write()
        except (WriteError, ConfigError, OSError) as exc:
            problems[what] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return problems


# -- reading ----------------------------------------------------------------------------------
def open_regular(path: str | os.PathLike, name: str = "") -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file (a symlink to one is
    followed); ReadError with one line otherwise. Never blocks: a named pipe with no writer is
    refused, not waited on. `name` is how messages call it (default: the path)."""
    name = name or str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ReadError(f"{name} does not exist") from None
    except OSError as exc:
        raise ReadError(f"cannot read {name}: {exc.strerror or exc}") from None
    kind = kind_of(info.st_mode)
    if kind is not None:
        raise ReadError(f"{name} is {kind}, not a regular file")
    try:
        # O_NONBLOCK: should the path have become a named pipe since the stat, the open does
        # not wait for a writer; the fstat below then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ReadError(f"cannot read {name}: {exc.strerror or exc}") from None
    kind = kind_of(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise ReadError(f"{name} is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_capped(path: str | os.PathLike, limit: int, name: str = "") -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; ReadError with one line
    for a file that is larger, not regular, missing or unreadable."""
    name = name or str(path)
    with open_regular(path, name) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise ReadError(f"{name} holds {size} bytes, more than the {limit} allowed")
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise ReadError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > limit:  # grown since the fstat
        raise ReadError(f"{name} holds more than the {limit} bytes allowed")
    return data


def keep_previous(path: str | os.PathLike, new: str | bytes) -> Path | None:
    """Copy the file at `path` to the first free name of `path.1`, `path.2`, ... before it is
    replaced, unless it already holds `new`: an export never replaces a file without keeping
    it. Returns the copy's path, or None when there was nothing to keep."""
    path = Path(path)
    new = new.encode("utf-8") if isinstance(new, str) else new
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None  # nothing to keep: the write that follows refuses a non-regular target
    try:
        old = path.read_bytes()
        mode = stat.S_IMODE(info.st_mode)
    except (FileNotFoundError, IsADirectoryError):
        return None
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

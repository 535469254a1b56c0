"""The result store: every trial `gputune tune` measured, kept in SQLite.

A result is keyed by the workload (`workload_key`: name, sequence length, seed, data), the
configuration (canonical JSON of `TuneConfig.to_dict()`), the number of measured and warm-up
steps, and the fingerprint of the machine and the code (gputune's version and a hash of its
kernels, strategies and trial code, torch, triton, CUDA, driver, the GPU or the CPU model), so a
second search on the same machine with the same code reuses what it measured (`--fresh` measures
again), and the dashboard can list what was measured here before. `tune` and `bench` both record.
A result measured by other code or on another machine never matches.

The database runs in WAL mode and every write is one transaction: a process killed in the middle
of a write leaves the previous state, never a half-written row. The file is never opened through
a symbolic link. A store that cannot be used (locked by another process for longer than
`LOCK_WAIT_S`, damaged, truncated, read-only) costs a run reuse and storing, never its
measurements: `open_store` and a store that breaks mid-run go on in memory, with one line saying
so. Torch-free (the parent process and the dashboard use it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from strategies.files import kind_of
from tuner_tui.engine.paths import gputune_home
from tuner_tui.engine.protocol import TrialResult

SCHEMA_VERSION = 2
"""2: results keyed by the code hash and gputune's version too, in a new table; the rows of
schema 1 (table `trials`), keyed without them, are left in the file and never read."""

LOCK_WAIT_S = 10.0
"""How long the store waits, with back-off, for another process's lock (a write by another
gputune takes milliseconds) before this run keeps its results in memory instead."""

SIDE_FILES = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside the database, checked like it: never opened through a link."""

FINGERPRINT_KEYS = (
    "device", "gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "gputune", "code",
)
"""What makes two measurements comparable. The host name is left out on purpose: two machines
with the same GPU, driver and software share results."""

REUSABLE = ("ok", "oom", "diverged", "compile", "invalid", "loss-mismatch", "numerics")
"""Statuses of stored results that `bench` and `tune` reuse. A crash (a dead process, a
timeout) may not happen again, so it is measured again."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    workload TEXT NOT NULL,
    config TEXT NOT NULL,
    steps INTEGER NOT NULL,
    warmup_steps INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    label TEXT NOT NULL,
    status TEXT NOT NULL,
    tokens_per_s REAL,
    peak_memory_bytes INTEGER,
    result TEXT NOT NULL,
    environment TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (workload, config, steps, warmup_steps, fingerprint)
);
CREATE INDEX IF NOT EXISTS results_by_fingerprint ON results (fingerprint, workload);
"""


def default_path() -> Path:
    return gputune_home() / "results.sqlite3"


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, so equal configurations are equal keys."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def workload_key(workload: Mapping) -> str:
    """What makes two runs of a workload the same: its name, sequence length, seed and data,
    and for a user's `module:function` its code (`Workload.code`: the function's qualified name
    and a hash of its module's file, so an edited model is measured again), from a
    `WorkerReady.workload` (the worker adds the seed and the resolved data path). The one key
    `tune` and `bench` store under and the dashboard's history asks for."""
    data = f"data={workload['data']}" if workload.get("data") else "synthetic"
    code = f" code={workload['code']}" if workload.get("code") else ""
    return (f"{workload['name']} seq={workload.get('items_per_sample')} "
            f"seed={workload.get('seed', 0)} {data}{code}")


def fingerprint(environment: Mapping) -> dict:
    """The part of a `WorkerReady.environment` that decides whether a result still holds. On the
    CPU, the processor stands in for the GPU."""
    fp = {key: environment.get(key) for key in FINGERPRINT_KEYS}
    if environment.get("device") != "cuda":
        fp["cpu"] = environment.get("cpu")
        fp["cpu_count"] = environment.get("cpu_count")
    return fp


@dataclass(frozen=True)
class StoredTrial:
    """One row of the store."""

    source: str
    """The command that measured it: tune or bench."""
    workload: str
    config: dict
    steps: int
    warmup_steps: int
    fingerprint: dict
    result: TrialResult
    environment: dict
    created: float
    """Seconds since the epoch when it was recorded."""


class StoreError(Exception):
    """The store cannot be opened or is not a gputune store; the message is one line."""

    locked = False
    """True when the cause is another process's lock, which may be gone later."""


def _warn(message: str) -> None:
    print(f"gputune: {message}", file=sys.stderr, flush=True)


def _is_lock(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class ResultStore:
    """A handle on one store file. Cheap to open; use it from one thread.

    A store that breaks during a search (damaged pages, a row that is not JSON) costs reuse,
    never a measurement: `lookup` then finds nothing, `record` keeps nothing, and `on_problem`
    (stderr by default) says so once per problem. A lock another process holds for longer than
    LOCK_WAIT_S moves the store into memory for the rest of the run (no more waits), and
    `close` stores what it kept there if the lock is gone by then."""

    def __init__(
        self, path: str | os.PathLike | None = None,
        on_problem: Callable[[str], None] = _warn,
    ) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.on_problem = on_problem
        self._told: set[str] = set()
        self.in_memory = ""
        """Why this store keeps its results in memory instead of its file; "" while it does not."""
        self._unsaved: list[tuple] = []
        """Rows recorded in memory because the file was locked: `close` tries to store them."""
        self._save_at_close = False
        self._db: sqlite3.Connection | None = None
        try:
            _check_path(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so a
            # write is exactly one transaction whatever the sqlite3 module's defaults. SQLite's
            # own wait is short; `_retrying` backs off and says why it waits.
            self._db = sqlite3.connect(self.path, timeout=2.0, isolation_level=None)
            self._retrying(self._open)
        except BaseException as exc:
            if self._db is not None:
                self._db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                error = StoreError(f"cannot open result store {self.path}: {_why(exc)}")
                error.locked = _is_lock(exc)
                raise error from None
            if isinstance(exc, OSError):
                detail = exc.strerror or exc
                raise StoreError(f"cannot open result store {self.path}: {detail}") from None
            raise

    @classmethod
    def in_memory_for(cls, path: str | os.PathLike | None, why: str,
                      on_problem: Callable[[str], None] = _warn,
                      locked: bool = False) -> "ResultStore":
        """A store that keeps this run's results in memory, standing in for the file at `path`
        that cannot be used; `on_problem` is told `why` once. `locked`: the file was only
        locked, so `close` tries to store the results there."""
        store = cls.__new__(cls)
        store.path = Path(path) if path is not None else default_path()
        store.on_problem, store._told, store._unsaved = on_problem, set(), []
        store._db = None
        store._to_memory(why, locked)
        return store

    def _to_memory(self, why: str, locked: bool) -> None:
        """From now on, results go to (and come from) a database in memory, a copy of the
        file's where it can still be read (read-only, locked); said once."""
        if self._db is not None:
            self._db.close()
        self._db = _copy_of(self.path)
        copied = self._db is not None
        if not copied:
            self._db = sqlite3.connect(":memory:", isolation_level=None)
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._db.execute(statement)
        self.in_memory, self._save_at_close = why, locked
        kept = ("in a copy of the store in memory (its results are reused" if copied
                else "in memory (none is reused")
        then = ("stored in the file at the end if the lock is gone then" if locked
                else "none is stored in the file")
        self._tell(f"{why}; this run goes on with its results kept {kept}; {then}; the report, "
                   "--json and the export have them all)")

    def _open(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode, NORMAL keeps the database consistent after a crash of the process
        # (a power loss may lose the last commits, never corrupt).
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"result store {self.path} was written by a newer gputune "
                f"(schema {version}, this one reads {SCHEMA_VERSION})"
            )
        with self._transaction():
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _transaction(self):
        return _Transaction(self._db)

    def _tell(self, problem: str) -> None:
        if problem not in self._told:
            self._told.add(problem)
            self.on_problem(problem)

    def _retrying(self, work: Callable[[], Any]) -> Any:
        """`work()`, retried with back-off while another process holds the database locked."""
        delay, deadline = 0.1, time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                return work()
            except sqlite3.Error as exc:
                if not _is_lock(exc) or time.monotonic() + delay > deadline:
                    raise
                self._tell(f"result store {self.path} is locked by another process; waiting up "
                           f"to {LOCK_WAIT_S:.0f} s")
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        if self._db is None:
            return
        self._db.close()
        self._db = None
        if self._unsaved:
            self._store_unsaved()

    def _store_unsaved(self) -> None:
        """The rows kept in memory while the file was locked, into the file if the lock is gone
        (one short try: the run is over)."""
        rows, self._unsaved = self._unsaved, []
        try:
            _check_path(self.path)
            db = sqlite3.connect(self.path, timeout=2.0, isolation_level=None)
        except (OSError, sqlite3.Error, StoreError):
            db = None
        try:
            if db is not None:
                with _Transaction(db):
                    for row in rows:
                        db.execute(_UPSERT, row)
                return
        except sqlite3.Error:
            pass
        finally:
            if db is not None:
                db.close()
        self.on_problem(f"result store {self.path}: {len(rows)} result(s) of this run were not "
                        "stored (the file is still locked); the next run measures them again")

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------
    def record(
        self,
        result: TrialResult,
        environment: Mapping,
        workload: str,
        steps: int,
        warmup_steps: int,
        source: str = "tune",
    ) -> None:
        """Keep one trial; a trial measured again with the same key replaces the older row."""
        row = (
            source,
            workload,
            canonical_json(result.config),
            steps,
            warmup_steps,
            canonical_json(fingerprint(environment)),
            result.label,
            result.status,
            result.tokens_per_s,
            result.peak_memory_bytes,
            canonical_json(result.to_dict()),
            canonical_json(dict(environment)),
            time.time(),
        )

        def write() -> None:
            with self._transaction():
                self._db.execute(_UPSERT, row)

        if self._save_at_close:
            self._unsaved.append(row)
        try:
            self._retrying(write)
        except sqlite3.Error as exc:
            if _is_lock(exc):
                self._to_memory(f"result store {self.path} is {_why(exc)}", locked=True)
                self._unsaved.append(row)
                write()
            else:
                self._tell(f"result store {self.path}: {_why(exc)}; this search goes on without "
                           "storing its trials (the report, --json and the export keep them)")

    # -- reading -------------------------------------------------------------------------------
    def lookup(
        self, workload: str, config: Mapping, steps: int, warmup_steps: int, environment: Mapping
    ) -> StoredTrial | None:
        """The stored trial for exactly this workload, configuration, steps and machine; None
        if there is none, or if the store cannot say (then `on_problem` is told why)."""
        def read() -> StoredTrial | None:
            cur = self._db.execute(
                "SELECT * FROM results WHERE workload = ? AND config = ? AND steps = ? "
                "AND warmup_steps = ? AND fingerprint = ?",
                (workload, canonical_json(dict(config)), steps, warmup_steps,
                 canonical_json(fingerprint(environment))),
            )
            row = cur.fetchone()
            return _stored(cur, row) if row else None

        try:
            return self._retrying(read)
        except sqlite3.Error as exc:
            if _is_lock(exc):
                self._to_memory(f"result store {self.path} is {_why(exc)}", locked=True)
                return None
            self._tell(f"result store {self.path}: {_why(exc)}; its results are not reused")
        except (ValueError, KeyError, TypeError) as exc:
            self._tell(f"result store {self.path} holds a damaged row ({type(exc).__name__}); "
                       "that configuration is measured again")
        return None

    def past(
        self, environment: Mapping | None = None, workload: str | None = None, limit: int = 1000
    ) -> list[StoredTrial]:
        """Past trials, newest first: for this machine (a `WorkerReady.environment`) and this
        workload when given. What the dashboard shows as this machine's history."""
        where, args = [], []
        if environment is not None:
            where.append("fingerprint = ?")
            args.append(canonical_json(fingerprint(environment)))
        if workload is not None:
            where.append("workload = ?")
            args.append(workload)
        sql = "SELECT * FROM results"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, id DESC LIMIT ?"
        try:
            cur = self._retrying(lambda: self._db.execute(sql, (*args, limit)))
            rows = cur.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"result store {self.path}: {_why(exc)}") from None
        kept = []
        for row in rows:
            try:
                kept.append(_stored(cur, row))
            except (ValueError, KeyError, TypeError):
                continue  # a damaged row: the others are still worth showing
        return kept

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]


_UPSERT = (
    "INSERT INTO results (source, workload, config, steps, warmup_steps, fingerprint, label, "
    "status, tokens_per_s, peak_memory_bytes, result, environment, created) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (workload, config, steps, warmup_steps, fingerprint) DO UPDATE SET "
    "source = excluded.source, label = excluded.label, status = excluded.status, "
    "tokens_per_s = excluded.tokens_per_s, peak_memory_bytes = excluded.peak_memory_bytes, "
    "result = excluded.result, environment = excluded.environment, created = excluded.created"
)


def open_store(path: str | os.PathLike | None = None,
               on_problem: Callable[[str], None] = _warn) -> ResultStore:
    """The store of a `bench` or `tune` run: the file at `path` (default: `default_path()`),
    or, where it cannot be used (locked for long, damaged, truncated, read-only, a symbolic
    link, written by a newer gputune), a store in memory, with one line to `on_problem`: the
    run goes on, reusing and storing nothing."""
    try:
        return ResultStore(path, on_problem)
    except StoreError as exc:
        return ResultStore.in_memory_for(path, str(exc), on_problem, exc.locked)


def _copy_of(path: Path) -> sqlite3.Connection | None:
    """The store at `path` copied into a database in memory, read without writing to the file
    (which may be read-only or locked by a writer); None where it cannot be read whole, or was
    written with another schema."""
    try:
        _check_path(path)
        uri = path.resolve().as_uri()
    except (StoreError, OSError, ValueError):
        return None
    # mode=ro reads alongside a writer; immutable=1 reads a WAL database in a folder this
    # process cannot write (mode=ro would need to create its -shm file there).
    for query in ("mode=ro", "immutable=1"):
        source = memory = None
        try:
            source = sqlite3.connect(f"{uri}?{query}", uri=True, timeout=1.0)
            memory = sqlite3.connect(":memory:", isolation_level=None)
            source.backup(memory)
            if memory.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                memory.close()
                return None
            memory.execute("SELECT COUNT(*) FROM results").fetchone()
            return memory
        except sqlite3.Error:
            if memory is not None:
                memory.close()
        finally:
            if source is not None:
                source.close()
    return None


def _check_path(path: Path) -> None:
    """StoreError unless the store and its side files are each missing or a regular file: a
    symbolic link is not followed (SQLite would create its target), a named pipe would block."""
    for candidate in (path, *(path.with_name(path.name + s) for s in SIDE_FILES)):
        try:
            info = candidate.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot open result store {path}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(info.st_mode):
            raise StoreError(f"result store {candidate} is a symbolic link, which gputune does "
                             "not follow: pass --store with the file itself")
        kind = kind_of(info.st_mode)
        if kind is not None:
            raise StoreError(f"result store {candidate} is {kind}, not a regular file")


def _why(exc: sqlite3.Error) -> str:
    if _is_lock(exc):
        return f"still locked by another process after {LOCK_WAIT_S:.0f} s"
    if isinstance(exc, sqlite3.DatabaseError) and "readonly" in str(exc).replace("-", ""):
        return "the file is read-only (pass --store elsewhere)"
    if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in str(exc)
                                                   or "not a database" in str(exc)):
        return "the file is damaged (move it aside, or pass --store elsewhere)"
    return str(exc)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error:
                self.db.execute("ROLLBACK")  # so that a retry can begin again
                raise
        self.db.execute("ROLLBACK")


def _stored(cursor: sqlite3.Cursor, row: tuple) -> StoredTrial:
    d = dict(zip((c[0] for c in cursor.description), row))
    return StoredTrial(
        source=d["source"],
        workload=d["workload"],
        config=json.loads(d["config"]),
        steps=d["steps"],
        warmup_steps=d["warmup_steps"],
        fingerprint=json.loads(d["fingerprint"]),
        result=TrialResult.from_dict(json.loads(d["result"])),
        environment=json.loads(d["environment"]),
        created=d["created"],
    )

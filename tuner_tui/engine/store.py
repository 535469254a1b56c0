"""The result store: every trial `gputune tune` measured, kept in SQLite.

A result is keyed by the workload (`workload_key`: name, sequence length, seed, data), the
configuration (canonical JSON of `TuneConfig.to_dict()`), the number of measured and warm-up
steps, and the fingerprint of the machine and the code (gputune's version and a hash of its
kernels, strategies and trial code, torch, triton, CUDA, driver, the GPU or the CPU model), so a
second search on the same machine with the same code reuses what it measured (`--fresh` measures
again), and the dashboard can list what was measured here before. `tune` and `bench` both record.
A result measured by other code or on another machine never matches.

The database runs in WAL mode and every write is one transaction: a process killed in the middle
of a write leaves the previous state, never a half-written row. Torch-free (the parent process
and the dashboard use it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tuner_tui.engine.paths import gputune_home
from tuner_tui.engine.protocol import TrialResult

SCHEMA_VERSION = 2
"""2: results keyed by the code hash and gputune's version too, in a new table; the rows of
schema 1 (table `trials`), keyed without them, are left in the file and never read."""

LOCK_WAIT_S = 120.0
"""How long a write waits, with back-off, for another process's lock before the trial is kept
only in memory (the report, the JSON and the export still have it)."""

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
    from a `WorkerReady.workload` (the worker adds the seed and the resolved data path). The
    one key `tune` and `bench` store under and the dashboard's history asks for."""
    data = f"data={workload['data']}" if workload.get("data") else "synthetic"
    return (f"{workload['name']} seq={workload.get('items_per_sample')} "
            f"seed={workload.get('seed', 0)} {data}")


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


def _warn(message: str) -> None:
    print(f"gputune: {message}", file=sys.stderr, flush=True)


def _is_lock(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class ResultStore:
    """A handle on one store file. Cheap to open; use it from one thread.

    A store that breaks during a search (damaged pages, a row that is not JSON, a lock another
    process holds too long) costs reuse, never a measurement: `lookup` then finds nothing,
    `record` keeps nothing, and `on_problem` (stderr by default) says so once per problem."""

    def __init__(
        self, path: str | os.PathLike | None = None,
        on_problem: Callable[[str], None] = _warn,
    ) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.on_problem = on_problem
        self._told: set[str] = set()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so a
            # write is exactly one transaction whatever the sqlite3 module's defaults. SQLite's
            # own wait is short; `_retrying` backs off and says why it waits.
            self._db = sqlite3.connect(self.path, timeout=2.0, isolation_level=None)
            self._retrying(self._open)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open result store {self.path}: {_why(exc)}") from None
        except OSError as exc:
            detail = exc.strerror or exc
            raise StoreError(f"cannot open result store {self.path}: {detail}") from None

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
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self._db.close()

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
                self._db.execute(
                    "INSERT INTO results (source, workload, config, steps, warmup_steps, "
                    "fingerprint, label, status, tokens_per_s, peak_memory_bytes, result, "
                    "environment, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (workload, config, steps, warmup_steps, fingerprint) DO UPDATE SET "
                    "source = excluded.source, label = excluded.label, status = excluded.status, "
                    "tokens_per_s = excluded.tokens_per_s, "
                    "peak_memory_bytes = excluded.peak_memory_bytes, result = excluded.result, "
                    "environment = excluded.environment, created = excluded.created",
                    row,
                )

        try:
            self._retrying(write)
        except sqlite3.Error as exc:
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


def _why(exc: sqlite3.Error) -> str:
    if _is_lock(exc):
        return f"still locked by another process after {LOCK_WAIT_S:.0f} s"
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in str(exc):
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

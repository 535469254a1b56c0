"""A result store that breaks during a search: damaged pages, a row that is not JSON, a lock held
by another process. Each costs reuse, never a measurement, and is said once."""

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from strategies.config import TuneConfig
from tuner_tui.engine import store as store_module
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.store import ResultStore

ENV = {"device": "cpu", "torch": "2.13", "cpu": "x86_64", "cpu_count": 2}


def _result(batch: int) -> TrialResult:
    config = TuneConfig.from_dict({"batch_size": batch})
    return TrialResult(config=config.to_dict(), label=config.label(), status="ok",
                       tokens_per_s=1000.0 + batch)


def _filled(path, rows=200) -> None:
    with ResultStore(path) as store:
        for batch in range(1, rows + 1):
            store.record(_result(batch), ENV, "gpt2-tiny", 20, 5)


def test_a_row_that_is_not_json_is_measured_again_and_left_out_of_the_history(tmp_path):
    path = tmp_path / "r.sqlite3"
    _filled(path, rows=3)
    db = sqlite3.connect(path)
    db.execute("UPDATE results SET result = '{not json' WHERE config LIKE '%\"batch_size\":2,%'")
    db.commit()
    db.close()
    told = []
    store = ResultStore(path, on_problem=told.append)
    config = _result(2).config
    assert store.lookup("gpt2-tiny", config, 20, 5, ENV) is None
    assert store.lookup("gpt2-tiny", config, 20, 5, ENV) is None
    assert len(told) == 1 and "damaged row" in told[0] and "measured again" in told[0]
    assert store.lookup("gpt2-tiny", _result(1).config, 20, 5, ENV).result.tokens_per_s == 1001.0
    assert sorted(t.result.batch_size or t.config["batch_size"] for t in store.past()) == [1, 3]
    store.close()


def test_damaged_pages_cost_reuse_and_storing_not_the_search(tmp_path):
    path = tmp_path / "r.sqlite3"
    _filled(path)
    with ResultStore(path) as store:  # fold the WAL into the main file before damaging it
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    page = 4096
    assert len(raw) > 4 * page
    raw[2 * page:len(raw) - page] = b"\xa5" * (len(raw) - 3 * page)
    path.write_bytes(bytes(raw))
    told = []
    store = ResultStore(path, on_problem=told.append)  # the header page is intact
    assert store.lookup("gpt2-tiny", _result(150).config, 20, 5, ENV) is None
    store.record(_result(500), ENV, "gpt2-tiny", 20, 5)  # does not raise
    assert told and all(str(path) in line for line in told)
    assert any("damaged" in line for line in told), told
    store.close()


HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def _lock_from_another_process(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_write_waits_with_back_off_for_another_process_lock(tmp_path):
    path = tmp_path / "r.sqlite3"
    _filled(path, rows=1)
    told = []
    store = ResultStore(path, on_problem=told.append)
    holder = _lock_from_another_process(path, 3.0)
    start = time.monotonic()
    store.record(_result(7), ENV, "gpt2-tiny", 20, 5)
    assert time.monotonic() - start > 1.0  # it waited for the lock rather than giving up
    holder.wait(timeout=30)
    assert store.lookup("gpt2-tiny", _result(7).config, 20, 5, ENV) is not None
    assert len(told) == 1 and "locked by another process; waiting" in told[0]
    store.close()


def test_a_lock_held_too_long_moves_the_run_to_memory_and_close_stores_it(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "LOCK_WAIT_S", 1.0)
    path = tmp_path / "r.sqlite3"
    _filled(path, rows=1)
    told = []
    store = ResultStore(path, on_problem=told.append)
    holder = _lock_from_another_process(path, 60.0)
    try:
        store.record(_result(9), ENV, "gpt2-tiny", 20, 5)  # waits a second, then memory
        start = time.monotonic()
        store.record(_result(10), ENV, "gpt2-tiny", 20, 5)
        assert store.lookup("gpt2-tiny", _result(9).config, 20, 5, ENV) is not None
        assert time.monotonic() - start < 0.5  # no more waits for the rest of the run
        assert store.in_memory and "still locked" in store.in_memory
        assert len([line for line in told if "results kept in" in line]) == 1, told
    finally:
        holder.kill()
        holder.wait()
    store.close()  # the lock is gone: what the run kept in memory goes to the file
    with ResultStore(path) as again:
        for batch in (1, 9, 10):
            assert again.lookup("gpt2-tiny", _result(batch).config, 20, 5, ENV) is not None


def test_a_store_locked_at_the_start_and_to_the_end_costs_one_line_each(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "LOCK_WAIT_S", 1.0)
    path = tmp_path / "r.sqlite3"
    _filled(path, rows=1)
    told = []
    holder = _lock_from_another_process(path, 60.0)
    try:
        store = store_module.open_store(path, on_problem=told.append)
        assert store.in_memory  # a copy of what the store held: still reused
        assert store.lookup("gpt2-tiny", _result(1).config, 20, 5, ENV) is not None
        store.record(_result(9), ENV, "gpt2-tiny", 20, 5)
        assert store.lookup("gpt2-tiny", _result(9).config, 20, 5, ENV) is not None
        store.close()
    finally:
        holder.kill()
        holder.wait()
    assert [line for line in told if "waiting" not in line] == [told[-2], told[-1]], told
    assert "kept in a copy of the store in memory (its results are reused" in told[-2]
    assert "1 result(s) of this run were not stored" in told[-1]


def _damaged(path) -> None:
    _filled(path, rows=3)
    path.write_bytes(path.read_bytes()[:100])  # truncated inside the header


def _dangling_link(path) -> None:
    path.symlink_to(path.parent / "elsewhere" / "target.sqlite3")


def _fifo(path) -> None:
    os.mkfifo(path)


def _link_beside(path) -> None:
    _filled(path, rows=1)
    path.with_name(path.name + "-wal").symlink_to(path.parent / "victim")


@pytest.mark.parametrize("make, words", [
    (_damaged, "the file is damaged"),
    (_dangling_link, "is a symbolic link"),
    (_fifo, "is a named pipe (fifo), not a regular file"),
    (_link_beside, "r.sqlite3-wal is a symbolic link"),
])
def test_a_store_that_cannot_be_used_is_one_line_and_a_store_in_memory(tmp_path, make, words):
    path = tmp_path / "r.sqlite3"
    make(path)
    told = []
    store = store_module.open_store(path, on_problem=told.append)
    store.record(_result(4), ENV, "gpt2-tiny", 20, 5)
    assert store.lookup("gpt2-tiny", _result(4).config, 20, 5, ENV) is not None
    store.close()
    assert len(told) == 1 and words in told[0] and "kept in memory (none is reused" in told[0], told
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "victim").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_store_is_one_line_and_a_store_in_memory(tmp_path):
    path = tmp_path / "r.sqlite3"
    _filled(path, rows=1)
    with ResultStore(path) as store:
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        told = []
        store = store_module.open_store(path, on_problem=told.append)
        assert store.lookup("gpt2-tiny", _result(1).config, 20, 5, ENV) is not None  # reused
        store.record(_result(2), ENV, "gpt2-tiny", 20, 5)
        store.close()
    finally:
        tmp_path.chmod(0o755)
    assert len(told) == 1 and "the file is read-only" in told[0], told


def test_tune_with_a_damaged_store_keeps_every_trial_in_its_json_and_export(gputune, tmp_path):
    import json

    path = tmp_path / "r.sqlite3"
    _filled(path)
    with ResultStore(path) as store:
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    raw[4096:] = b"\xa5" * (len(raw) - 4096)  # every page but the schema's
    path.write_bytes(bytes(raw))
    out, js = tmp_path / "best.toml", tmp_path / "tune.json"
    proc = gputune("tune", "--device", "cpu", "--workload", "gpt2-tiny", "--steps", "2",
                   "--warmup", "1", "--search", "precision=fp32", "--set", "compile_mode=off",
                   "--set", "checkpointing=off", "--set", "batch_size=0",
                   "--set", "optimizer=plain", "--set", "attention=manual",
                   "--set", "fused_kernels=", "--set", "weights=fp32",
                   "--set", "optimizer_state=fp32", "--set", "micro_batch_size=0",
                   "--store", str(path), "--out", str(out),
                   "--json", str(js), "--max-memory", "8GiB")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"result store {path}: the file is damaged" in proc.stderr
    assert json.loads(js.read_text())["results"][0]["status"] == "ok"
    assert "[config]" in out.read_text()

"""The result store: keys, past results per machine, a process killed in the middle of a write."""

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.store import ResultStore, StoreError, default_path, fingerprint

H200 = {"device": "cuda", "gpu_name": "NVIDIA H200", "gpu_count": 1, "driver": "580.159.04",
        "cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "host": "a", "cpu": "x86_64",
        "gputune": "0.1.0", "code": "0123456789abcdef"}


def _result(tokens_per_s=1000.0, **config) -> TrialResult:
    return TrialResult(config={"precision": "fp32", **config}, label="fp32", status="ok",
                       tokens_per_s=tokens_per_s, peak_memory_bytes=123, losses=(4.0, 3.5))


def test_lookup_matches_workload_config_steps_and_machine(tmp_path):
    with ResultStore(tmp_path / "r.sqlite3") as store:
        store.record(_result(precision="bf16", batch_size=8), H200, "gpt2-124m", 20, 5)
        # Key order of the configuration does not matter: it is stored as canonical JSON.
        hit = store.lookup("gpt2-124m", {"batch_size": 8, "precision": "bf16"}, 20, 5, H200)
        assert hit is not None and hit.result.tokens_per_s == 1000.0
        assert hit.result.losses == (4.0, 3.5) and hit.environment["gpu_name"] == "NVIDIA H200"
        config = {"precision": "bf16", "batch_size": 8}
        assert store.lookup("gpt2-350m", config, 20, 5, H200) is None
        assert store.lookup("gpt2-124m", config, 10, 5, H200) is None
        assert store.lookup("gpt2-124m", config, 20, 5, {**H200, "driver": "590.1"}) is None
        # The host is not part of the fingerprint: the same GPU and software elsewhere match.
        assert store.lookup("gpt2-124m", config, 20, 5, {**H200, "host": "b"}) is not None


def test_measuring_again_replaces_and_past_lists_this_machine_newest_first(tmp_path):
    with ResultStore(tmp_path / "r.sqlite3") as store:
        store.record(_result(1.0), H200, "w", 20, 5)
        store.record(_result(2.0), H200, "w", 20, 5)
        store.record(_result(3.0, optimizer="fused"), H200, "w", 20, 5)
        store.record(_result(4.0), {**H200, "gpu_name": "NVIDIA A100"}, "w", 20, 5)
        assert len(store) == 3
        past = store.past(H200)
        assert [p.result.tokens_per_s for p in past] == [3.0, 2.0]
        assert store.past(H200, workload="other") == []
        assert len(store.past()) == 3
    keys = ("device", "gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "gputune",
            "code")
    assert fingerprint(H200) == {k: H200[k] for k in keys}


def test_wal_mode_default_path_and_a_newer_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / "results.sqlite3"
    with ResultStore() as store:
        assert store.path == default_path()
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db = sqlite3.connect(default_path())
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="newer gputune"):
        ResultStore()
    (tmp_path / "junk.sqlite3").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        ResultStore(tmp_path / "junk.sqlite3")


def test_results_of_other_code_or_an_older_schema_are_never_reused(tmp_path):
    path = tmp_path / "r.sqlite3"
    # A store written by schema 1: rows keyed without the code hash or gputune's version.
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE trials (id INTEGER PRIMARY KEY, workload TEXT, config TEXT, "
               "steps INTEGER, warmup_steps INTEGER, fingerprint TEXT, result TEXT)")
    db.execute("INSERT INTO trials (workload, config, steps, warmup_steps, fingerprint, result) "
               "VALUES ('w', '{}', 20, 5, '{}', '{}')")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with ResultStore(path) as store:
        assert len(store) == 0 and store.past() == []
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == 2
        store.record(_result(), H200, "w", 20, 5)
        assert store.lookup("w", _result().config, 20, 5, H200) is not None
        for key, other in (("code", "fedcba9876543210"), ("gputune", "0.2.0"), ("torch", "2.14"),
                           ("triton", "3.7"), ("cuda", "13.1"), ("driver", "590"),
                           ("gpu_name", "NVIDIA A100")):
            assert store.lookup("w", _result().config, 20, 5, {**H200, key: other}) is None, key
    cpu = {"device": "cpu", "cpu": "AMD EPYC 9654", "cpu_count": 2, "code": "1", "gputune": "0.1.0"}
    assert fingerprint(cpu) != fingerprint({**cpu, "cpu": "Intel Xeon 8480"})


def test_the_code_hash_covers_kernels_strategies_and_the_trial_code():
    from strategies.code_version import code_files, code_hash

    names = [name for name, _ in code_files()]
    for expected in ("kernels/layer_norm.py", "strategies/compose.py", "tuner_tui.engine/trial.py",
                     "tuner_tui.engine/worker.py", "tuner_tui.engine/gradients.py",
                     "tuner_tui.engine.workloads/gpt.py"):
        assert expected in names
    assert len(code_hash()) == 16 and code_hash() == code_hash()


def test_a_worker_describes_its_machine_code_and_workload_key(tmp_path):
    from strategies.code_version import code_hash
    from tuner_tui.engine.runner import start_worker
    from tuner_tui.engine.protocol import WorkerSpec
    from tuner_tui.engine.store import workload_key

    data = tmp_path / "corpus.txt"
    data.write_text("hello world " * 400)
    client, ready = start_worker(WorkerSpec(workload="gpt2-tiny", device="cpu", seed=3,
                                            data=str(data)))
    client.stop()
    env = ready.environment
    assert env["code"] == code_hash() and env["gputune"] and env["cpu"]
    # One key for what tune and bench store and what the dashboard's `h` asks for.
    assert workload_key(ready.workload) == f"gpt2-tiny seq=64 seed=3 data={data.resolve()}"
    assert workload_key({**ready.workload, "data": None, "seed": 0}) == \
        "gpt2-tiny seq=64 seed=0 synthetic"


WRITER = textwrap.dedent("""
    import sys
    from tuner_tui.engine.protocol import TrialResult
    from tuner_tui.engine.store import ResultStore

    store = ResultStore(sys.argv[1])
    env = {"device": "cpu", "torch": "2.13", "cpu": "x86_64", "cpu_count": 2}
    i = 0
    while True:
        r = TrialResult(config={"batch_size": i}, label=f"batch {i}", status="ok",
                        tokens_per_s=float(i), losses=tuple(float(j) for j in range(200)),
                        message="x" * 5000)
        store.record(r, env, "gpt2-tiny", 2, 1)
        i += 1
        if i == 20:
            print("ready", flush=True)
""")


def test_a_process_killed_while_writing_leaves_a_readable_store(tmp_path):
    path = tmp_path / "r.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # well inside the loop: a write is almost surely in flight
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with ResultStore(path) as store:
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = store.past(limit=10**6)
        assert len(rows) >= 20 and len(rows) == len(store)
        # Writes committed in order, none lost in the middle: batch sizes 0..n-1.
        assert sorted(r.config["batch_size"] for r in rows) == list(range(len(rows)))
        for row in rows:  # every row whole: its JSON parses and matches its columns
            assert row.result.label == f"batch {row.config['batch_size']}"
            assert len(row.result.losses) == 200 and len(row.result.message) == 5000
        store.record(_result(), H200, "after", 2, 1)  # and it takes new writes
        assert store.lookup("after", {"precision": "fp32"}, 2, 1, H200) is not None

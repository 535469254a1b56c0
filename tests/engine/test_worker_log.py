"""A worker's output goes to its run's log, never the terminal; its warnings are passed on once
each and summarised once by bench and tune."""

import json
import subprocess
import sys
import textwrap

from tuner_tui.engine import worker_log


def test_a_worker_prints_nothing_to_the_terminal_and_passes_each_warning_on_once(tmp_path):
    log = tmp_path / "runs" / "r" / "worker.log"
    code = textwrap.dedent(f"""
        import json, logging, os, sys, warnings
        from tuner_tui.engine import worker_log
        seen = []
        worker_log.capture_output({str(log)!r}, lambda *a: seen.append(a))
        logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: no such file")
        logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: no such file")
        torch_log = logging.getLogger("torch")   # torch's own logger keeps its records
        torch_log.propagate = False
        torch_log.addHandler(logging.StreamHandler(sys.stderr))
        worker_log.attach_library_loggers()
        logging.getLogger("torch.utils._pytree").warning(
            "W1202 06:12:14.123 77 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass")
        warnings.warn("OptimState8bit does not implement _stable_hash_f.")
        print("a print")
        os.write(2, b"W1202 a C++ line\\n")
        with open({str(tmp_path / "seen.json")!r}, "w") as f:
            json.dump(seen, f)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
    text = log.read_text()
    for line in ("Failed to load", "Enum subclass", "OptimState8bit", "a print", "a C++ line"):
        assert line in text
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert [s[2] for s in seen] == ["torchao", "torch", "warnings"]
    assert seen[1][1] == "<enum 'KernelPreference'> is an Enum subclass"
    summary = worker_log.summary_lines(log)
    assert summary[0] == f"worker warnings: 4 (3 distinct), in {log}"
    assert summary[1] == "  2x Failed to load /x/_C_mxfp8.so: no such file"


def test_the_summary_names_crash_reports_and_is_empty_without_a_log(tmp_path):
    assert worker_log.summary_lines(None) == []
    log = tmp_path / "worker.log"
    log.write_text("Traceback (most recent call last):\n  File x\nValueError: y\n")
    assert worker_log.summary_lines(log) == [f"worker crash reports: 1, in {log}"]


def test_run_folders_are_made_under_the_home_and_the_oldest_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    monkeypatch.setattr(worker_log, "RUNS_KEPT", 2)
    for name in ("20200101-000000-bench-1", "20200102-000000-bench-1", "20200103-000000-bench-1"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    path = worker_log.new_run_log("tune")
    assert path.name == "worker.log" and path.parent.parent == tmp_path / "runs"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir())[0] == "20200103-000000-bench-1"

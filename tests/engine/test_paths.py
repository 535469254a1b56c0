"""Where gputune keeps its files: compile caches in a private folder, for every command."""

import argparse
import os
import stat

from tuner_tui import cli
from tuner_tui.engine.paths import compile_cache_environ


def test_the_compile_cache_is_a_private_folder_under_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = tmp_path / "inductor"
    assert compile_cache_environ()["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)  # opened up by someone: closed again before a worker uses it
    compile_cache_environ()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_cache_folder_that_cannot_be_private_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    (tmp_path / "inductor").symlink_to(elsewhere)
    assert "TORCHINDUCTOR_CACHE_DIR" not in compile_cache_environ()


def test_bench_tune_and_the_dashboard_workers_get_the_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    args = argparse.Namespace(workload="gpt2-tiny", device="cpu", data=None, seed=0, seq_len=None)
    environ = dict(cli.worker_spec(args).environ)
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert "TORCHINDUCTOR_CACHE_DIR" not in dict(cli.worker_spec(args).environ)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")

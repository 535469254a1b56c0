"""`write_atomic`: every file gputune writes goes through it."""

import os
import stat

import pytest

from strategies import files
from strategies.config import TuneConfig, save
from strategies.files import WriteError, check_writable, write_atomic


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_file_gets_the_umask_mode_and_an_old_one_keeps_its_mode(tmp_path):
    old_mask = os.umask(0o022)
    try:
        new = write_atomic(tmp_path / "new.json", "{}\n")
        assert _mode(new) == 0o644 and new.read_text() == "{}\n"
        kept = tmp_path / "kept.toml"
        kept.write_text("old")
        kept.chmod(0o640)
        save(TuneConfig.from_dict({"precision": "bf16"}), kept)
        assert _mode(kept) == 0o640 and "bf16" in kept.read_text()
    finally:
        os.umask(old_mask)


def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "results.json"
    link.symlink_to(victim)
    write_atomic(link, "new")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "new"


def test_the_temporary_name_is_unpredictable_and_removed_on_failure(tmp_path, monkeypatch):
    seen = []

    def failing_replace(src, dst):
        seen.append(os.path.basename(src))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", failing_replace)
    target = tmp_path / "r.json"
    target.write_text("before")
    for _ in range(2):
        with pytest.raises(WriteError, match=r"cannot write .*r\.json: No space left on device"):
            write_atomic(target, "after")
    assert seen[0] != seen[1] and "r.json.tmp" not in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert target.read_text() == "before"


def test_check_writable_names_the_problem(tmp_path):
    check_writable(tmp_path / "ok.json", "--json")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    with pytest.raises(WriteError, match="--json .* is a folder"):
        check_writable(tmp_path, "--json")
    with pytest.raises(WriteError, match="missing.r.json: its folder does not exist"):
        check_writable(tmp_path / "missing" / "r.json", "--json")
    with pytest.raises(WriteError, match="cannot write in folder /proc"):
        check_writable("/proc/r.json", "--out")

"""`write_atomic`: every file gputune writes goes through it; `read_capped`: every file it reads
from the user."""

import os
import re
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


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a named pipe (fifo)"),
    (lambda p: p.mkdir(), "a folder"),
])
def test_a_target_that_is_not_a_regular_file_is_refused_not_replaced(tmp_path, make, kind):
    target = tmp_path / "out.json"
    make(target)
    with pytest.raises(WriteError, match=r"cannot write .*out\.json: it is " + re.escape(kind)):
        write_atomic(target, "{}")
    assert not target.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_device_is_never_replaced_even_by_root():
    # As root, the rename into /dev would succeed: the device node must be refused first.
    with pytest.raises(WriteError, match="it is a character device"):
        write_atomic("/dev/null", "{}")
    with pytest.raises(WriteError, match="--json /dev/null is a character device"):
        check_writable("/dev/null", "--json")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_write_all_writes_every_output_it_can(tmp_path):
    blocked = tmp_path / "blocked.json"
    blocked.mkdir()
    problems = files.write_all([
        ("--json blocked.json", lambda: write_atomic(blocked, "{}")),
        ("--export best.toml", lambda: save(TuneConfig.from_dict({}), tmp_path / "best.toml")),
        ("--other", lambda: write_atomic(tmp_path / "missing" / "x.json", "{}")),
    ])
    assert (tmp_path / "best.toml").read_text().startswith("[config]")
    assert list(problems) == ["--json blocked.json", "--other"]
    assert "it is a folder" in problems["--json blocked.json"]
    assert all("\n" not in line for line in problems.values())


@pytest.mark.timeout(20)
@pytest.mark.parametrize("path, kind", [
    ("{fifo}", "is a named pipe (fifo), not a regular file"),
    ("/dev/zero", "is a character device, not a regular file"),
    ("{folder}", "is a folder, not a regular file"),
    ("{missing}", "does not exist"),
])
def test_reading_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, path, kind):
    os.mkfifo(tmp_path / "fifo")  # no writer: opening it to read would block
    path = path.format(fifo=tmp_path / "fifo", folder=tmp_path, missing=tmp_path / "nope")
    with pytest.raises(files.ReadError, match=re.escape(f"input {path} {kind}")):
        files.read_capped(path, 100, f"input {path}")


def test_reading_is_capped(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * 101)
    with pytest.raises(files.ReadError, match="holds 101 bytes, more than the 100 allowed"):
        files.read_capped(big, 100)
    assert files.read_capped(big, 101) == b"#" * 101

"""What a run writes survives what happens to its terminal and its other outputs: a closed
terminal costs the printing only, an output file that became unwritable costs that file only;
one line says what was not written, and the exit code says so."""

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

from tuner_tui import cli, terminal

ROOT = Path(__file__).resolve().parents[2]


def _env(home: Path) -> dict:
    return dict(os.environ, GPUTUNE_HOME=str(home),
                PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "pythonpath")]))


def test_a_closed_pipe_costs_the_printing_only():
    read_end, write_end = os.pipe()
    os.close(read_end)
    raw = os.fdopen(write_end, "w", buffering=1)
    stream = terminal.TerminalStream(raw)
    print("the table", file=stream, flush=True)  # EPIPE: dropped, not raised
    assert stream.lost
    print("more", file=stream, flush=True)
    raw.write("and the wrapped stream itself, flushed at exit\n")
    raw.flush()  # its descriptor now leads to /dev/null
    raw.close()


def _as_terminal() -> None:
    """In the child: the pty (its stdin) becomes the controlling terminal of its new session,
    and Ctrl-C and a hang-up act as they do in a terminal's foreground job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_terminal_closed_during_tune_still_gets_the_json_and_the_export(tmp_path):
    """The terminal window closed mid-search: SIGHUP, then every print fails (EIO). The
    trials measured until then are still ranked, written to --json and exported."""
    doc, best = tmp_path / "tune.json", tmp_path / "best.toml"
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner_tui.cli", "tune", "--device", "cpu", "--workload",
         "gpt2-tiny", "--steps", "8", "--warmup", "1", "--remeasure", "0",
         "--search", "precision=fp32,bf16", "--search", "attention=manual,sdpa",
         "--json", str(doc), "--out", str(best)],
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=_as_terminal,
        env=_env(tmp_path), cwd=ROOT)
    os.close(slave)
    shown, deadline = b"", time.monotonic() + 120
    try:
        while b"[2/" not in shown:  # the first trial measured, the second begun
            assert time.monotonic() < deadline and proc.poll() is None, shown[-2000:]
            if select.select([master], [], [], 1.0)[0]:
                shown += os.read(master, 1 << 16)
    finally:
        os.close(master)  # the terminal closes
    code = proc.wait(timeout=90)
    assert code == 130, _left_behind(tmp_path, code)
    written = json.loads(doc.read_text())
    assert written["interrupted"] is True and written["results"], (written, shown[-3000:])
    assert "[config]" in best.read_text()


def _left_behind(home: Path, code: int) -> str:
    """What a run whose terminal is gone left to say why it exited with `code`: its files under
    its home (the workers' log, the report) and its JSON, tails of each."""
    parts = [f"exit code {code}"]
    for path in sorted(p for p in home.rglob("*") if p.is_file() and p.suffix in (
            ".log", ".txt", ".json")):
        parts.append(f"--- {path.relative_to(home)}\n{path.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts)


def test_an_output_that_became_unwritable_mid_run_costs_only_that_output(tmp_path):
    """--json turned into a folder while bench measures: the table is printed, the export
    written, one line names the JSON, and the exit code is 3."""
    doc, best = tmp_path / "bench.json", tmp_path / "best.toml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner_tui.cli", "bench", "--device", "cpu", "--workload",
         "gpt2-tiny", "--preset", "quick", "--steps", "3", "--warmup", "1", "--remeasure", "0",
         "--json", str(doc), "--export", str(best)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=ROOT)
    deadline = time.monotonic() + 120
    while not doc.exists():  # written after the first row
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    doc.unlink()
    doc.mkdir()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_NOT_WRITTEN, err
    assert err.strip().splitlines() == [
        f"gputune: not written: --json {doc}: cannot write {doc}: it is a folder, not a regular "
        "file"], err
    assert "bf16 + sdpa + foreach AdamW" in out and f"to {best}" in out
    assert "[config]" in best.read_text()

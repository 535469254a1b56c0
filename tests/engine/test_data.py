"""`--data FILE`: batches from a text file, held in memory at about the file's size."""

import subprocess
import sys
from pathlib import Path

import torch

from tuner_tui.engine.workloads.data import TextFileTokens

ROOT = Path(__file__).resolve().parents[2]

MEASURE = """
import gc, sys, psutil, torch
from tuner_tui.engine.workloads.data import TextFileTokens
proc = psutil.Process()
gc.collect()
before = proc.memory_info().rss
tokens = TextFileTokens(sys.argv[1], 64, 0)
x, y = tokens.batch(0, 4, torch.device("cpu"))
gc.collect()
print(proc.memory_info().rss - before)
"""


def test_batches_are_windows_of_the_file_as_int64(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 4)
    tokens = TextFileTokens(path, 16, seed=3)
    x, y = tokens.batch(5, 3, torch.device("cpu"))
    assert x.dtype == torch.int64 and x.shape == (3, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y[:, 0], (x[:, 0] + 1) % 256)  # consecutive bytes of the file
    again, _ = TextFileTokens(path, 16, seed=3).batch(5, 3, torch.device("cpu"))
    assert torch.equal(x, again)


def test_a_large_file_costs_about_its_size_in_memory(tmp_path):
    size = 64 * 2**20
    path = tmp_path / "big.txt"
    with open(path, "wb") as handle:
        handle.truncate(size)  # sparse: bytes of value 0, no disk written
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.split()[-1])
    assert grown < 2 * size, f"{grown / size:.1f}x the file"


def test_a_file_larger_than_memory_allows_is_refused_before_it_is_read(tmp_path):
    import psutil
    import pytest

    path = tmp_path / "huge.txt"
    size = int(psutil.virtual_memory().available * 4) + 1
    with open(path, "wb") as handle:
        handle.truncate(size)  # sparse: nothing is written to disk
    with pytest.raises(ValueError, match=r"holds .* GiB, more than the .* GiB allowed here"):
        TextFileTokens(path, 64, 0)


def test_a_named_pipe_is_refused_not_waited_on(tmp_path):
    import os

    import pytest

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match=r"is a named pipe \(fifo\), not a regular file"):
        TextFileTokens(tmp_path / "fifo", 64, 0)

"""Token batches that are the same for every configuration: batch `i` is a pure function of
(seed, i, batch size), so every configuration trains on the same data in the same order."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import torch

from strategies.files import ReadError, open_regular


class SyntheticTokens:
    """Tokens drawn from a Zipf distribution over the vocabulary. Skewed like text, so the loss
    falls in the first steps and the correctness check compares real learning curves (uniform
    random tokens would pin every configuration's loss at log(vocab))."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, exponent: float = 1.1) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
        probs = ranks.pow(-exponent)
        # Shuffle which token ids are frequent, deterministically, so it isn't just low ids.
        perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
        self._cdf = (probs / probs.sum()).cumsum(0).float()
        self._ids = perm
        self._device_tables: dict = {}

    def batch(self, step: int, batch_size: int, device: torch.device):
        key = str(device)
        if key not in self._device_tables:
            self._device_tables[key] = (self._cdf.to(device), self._ids.to(device))
        cdf, ids = self._device_tables[key]
        gen = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + step)
        u = torch.rand(batch_size, self.seq_len + 1, generator=gen, device=device)
        tokens = ids[torch.searchsorted(cdf, u).clamp_(max=self.vocab_size - 1)]
        return tokens[:, :-1], tokens[:, 1:]


MEMORY_SHARE = 0.25
"""The largest --data file read, as a share of the memory available: the file is held in memory
by each worker, and two are up at once (the next trial's starts during the current one)."""


class TextFileTokens:
    """Byte-level tokens from a text file; batch `i` takes random windows seeded by `i`."""

    def __init__(self, path: str | Path, seq_len: int, seed: int) -> None:
        # Read once into a buffer the tensor shares, and kept as bytes: a window is widened
        # to int64 only when it is batched, so memory stays about the file's size.
        try:
            handle = open_regular(path, f"--data file {path}")
        except ReadError as exc:
            raise ValueError(str(exc)) from None
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if size < seq_len + 2:
                raise ValueError(
                    f"--data file {path} holds {size} bytes; it needs at least {seq_len + 2} "
                    f"for one sequence of {seq_len} tokens"
                )
            limit = int(psutil.virtual_memory().available * MEMORY_SHARE)
            if size > limit:
                gib = 1024**3
                raise ValueError(
                    f"--data file {path} holds {size / gib:.1f} GiB, more than the "
                    f"{limit / gib:.1f} GiB allowed here (a quarter of the available memory: "
                    f"each worker reads it into memory); use a part of it, e.g. head -c 1G "
                    f"{path} > part.txt")
            data = bytearray(size)
            view, read = memoryview(data), 0
            while read < size:  # one read() returns at most 2 GiB on Linux
                n = handle.readinto(view[read:])
                if not n:
                    break
                read += n
        self.tokens = torch.frombuffer(data, dtype=torch.uint8)[:read]
        self.seq_len, self.seed = seq_len, seed
        self.vocab_size = 256

    def batch(self, step: int, batch_size: int, device: torch.device):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (batch_size,), generator=gen)
        rows = torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts.tolist()]).long()
        if device.type == "cuda":
            # From pinned memory the copy is truly asynchronous; from pageable memory it is not.
            rows = rows.pin_memory()
        rows = rows.to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]

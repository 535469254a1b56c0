"""The CPU's peak memory: the process's resident high-water mark (Linux's VmHWM), started again
where a run's measurement starts.

Sampled at the end of each step, the resident size misses what a step allocates and frees
within itself: Gemma 3 270M's shape at 256 tokens on two CPU cores reported a peak of 6.41 GiB
at batch 8, the memory model scaled it to 13.7 GiB at batch 32, and the kernel killed both batch
32 trials on the 23-GiB machine (their logits alone, fp32, are 8 GiB; their log-softmax and its
gradient as much again). The high-water mark holds every page the process touched. Torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset() -> bool:
    """Start the high-water mark again from the resident size now (Linux 4.0 and later); False
    where it cannot be (another system, or /proc not writable): the caller samples instead."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return high_water() is not None


def high_water() -> int | None:
    """The most resident memory the process has held since the last `reset`, in bytes (None
    where the system does not say)."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None

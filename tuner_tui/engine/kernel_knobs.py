"""The environment variables the fused kernels read, checked before any measurement. Torch-free.

The kernels read them in the worker, where a bad value would surface as a failed trial; the
CLI checks them first, so that a typo gets one line and exit 2 like any other bad input.
"""

from __future__ import annotations

import os

#: GPUTUNE_PARTIAL_SUMS: how the norms add their weight gradients' partial sums
#: (kernels/_partial_sums.py MODES; tests/kernels/test_package.py holds the two equal).
PARTIAL_SUMS_MODES = ("kernel", "torch")


def problems(environ=os.environ) -> list[str]:
    """One line per kernel variable in `environ` whose value the kernels would refuse."""
    out = []
    mode = environ.get("GPUTUNE_PARTIAL_SUMS")
    if mode is not None and mode not in PARTIAL_SUMS_MODES:
        out.append(f"GPUTUNE_PARTIAL_SUMS is {mode!r}; allowed: {', '.join(PARTIAL_SUMS_MODES)}")
    rows = environ.get("GPUTUNE_LCE_CHUNK_ROWS", "").strip()
    if rows and not (rows.isdigit() and int(rows) >= 1):
        out.append(f"GPUTUNE_LCE_CHUNK_ROWS is {rows!r}; allowed: a positive integer (rows per chunk)")
    launch = environ.get("GPUTUNE_FAST_LAUNCH")
    if launch is not None and launch not in ("0", "1"):
        out.append(f"GPUTUNE_FAST_LAUNCH is {launch!r}; allowed: 1 (direct launch) or 0 (Triton's usual launch)")
    native = environ.get("GPUTUNE_NATIVE")
    if native is not None and native not in ("0", "1"):
        out.append(f"GPUTUNE_NATIVE is {native!r}; allowed: 1 (the C++ autograd nodes) or 0 (the Python path)")
    return out

"""The GPUTUNE_* environment variables the worker reads, checked before any measurement.
Torch-free.

The kernels and the worker read them in the worker process, where a bad value would surface as
a failed trial; the CLI checks them first, so that a typo gets one line and exit 2 like any other
bad input.
"""

from __future__ import annotations

import math
import os
import re

#: GPUTUNE_PARTIAL_SUMS: how the norms add their weight gradients' partial sums
#: (kernels/_partial_sums.py MODES; tests/kernels/test_package.py holds the two equal).
PARTIAL_SUMS_MODES = ("kernel", "torch")
MAX_CHUNK_ROWS = 2**31
"""GPUTUNE_LCE_CHUNK_ROWS at most: rows per chunk of the fused loss (clamped to the rows)."""

WORKLOAD_TIMEOUT_ENV = "GPUTUNE_WORKLOAD_TIMEOUT"
WORKLOAD_TIMEOUT_S = 240.0
"""How long a worker waits for a workload's function and its first batch by default: a user's
function that loads a large model from disk may take minutes, one that never returns must not
hang gputune."""
MAX_WORKLOAD_TIMEOUT_S = 86400.0
OPTIMIZER_WARMUP_ENV = "GPUTUNE_OPTIMIZER_WARMUP"
"""0 keeps `tune` from compiling torchao's optimizer steps beside its trials
(`runner.OptimizerStepWarmup`); 1, the default, lets it."""


def optimizer_warmup(environ=os.environ) -> bool:
    """Whether `tune` compiles torchao's optimizer steps beside its trials."""
    return environ.get(OPTIMIZER_WARMUP_ENV, "1") != "0"


def native_nodes(environ=os.environ) -> bool:
    """Whether the fused kernels' eager calls may take the C++ nodes ($GPUTUNE_NATIVE, 1 by
    default; `gputune_kernels._native` reads it in the worker)."""
    return environ.get("GPUTUNE_NATIVE", "1") != "0"


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _seconds(text: str) -> float | None:
    """A timeout in seconds from its text, None unless above 0 and at most a day."""
    try:
        value = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        return None
    return value if 0 < value <= MAX_WORKLOAD_TIMEOUT_S else None


def workload_timeout_s(environ=os.environ) -> float:
    """Seconds a worker gives the workload's function and its first batch
    ($GPUTUNE_WORKLOAD_TIMEOUT, default WORKLOAD_TIMEOUT_S; a value `problems` refuses counts
    as the default)."""
    text = environ.get(WORKLOAD_TIMEOUT_ENV, "").strip()
    return (_seconds(text) if text else None) or WORKLOAD_TIMEOUT_S


def problems(environ=os.environ) -> list[str]:
    """One line per variable in `environ` whose value the worker would refuse, each naming
    the allowed values."""
    out = []
    mode = environ.get("GPUTUNE_PARTIAL_SUMS")
    if mode is not None and mode not in PARTIAL_SUMS_MODES:
        out.append(f"GPUTUNE_PARTIAL_SUMS is {_shown(mode)}; allowed: "
                   + ", ".join(PARTIAL_SUMS_MODES))
    rows = environ.get("GPUTUNE_LCE_CHUNK_ROWS", "").strip()
    if rows and not (re.fullmatch(r"[0-9]{1,10}", rows) and 1 <= int(rows) <= MAX_CHUNK_ROWS):
        out.append(f"GPUTUNE_LCE_CHUNK_ROWS is {_shown(rows)}; allowed: a positive integer "
                   f"(rows per chunk) up to {MAX_CHUNK_ROWS}")
    launch = environ.get("GPUTUNE_FAST_LAUNCH")
    if launch is not None and launch not in ("0", "1"):
        out.append(f"GPUTUNE_FAST_LAUNCH is {_shown(launch)}; allowed: 1 (direct launch) or 0 "
                   "(Triton's usual launch)")
    native = environ.get("GPUTUNE_NATIVE")
    if native is not None and native not in ("0", "1"):
        out.append(f"GPUTUNE_NATIVE is {_shown(native)}; allowed: 1 (the C++ autograd nodes) or 0 "
                   "(the Python path)")
    warmup = environ.get(OPTIMIZER_WARMUP_ENV)
    if warmup is not None and warmup not in ("0", "1"):
        out.append(f"{OPTIMIZER_WARMUP_ENV} is {_shown(warmup)}; allowed: 1 (tune compiles "
                   "torchao's optimizer steps beside its trials) or 0 (each trial compiles its own)")
    timeout = environ.get(WORKLOAD_TIMEOUT_ENV, "").strip()
    if timeout and _seconds(timeout) is None:
        out.append(f"{WORKLOAD_TIMEOUT_ENV} is {_shown(timeout)}; allowed: a number of seconds "
                   f"above 0 and up to {MAX_WORKLOAD_TIMEOUT_S:g} (how long a worker waits for "
                   "the workload's function and its first batch)")
    return out

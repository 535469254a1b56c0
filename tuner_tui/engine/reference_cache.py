"""The fp32 eager reference, computed once and kept on disk: per workload, seed, batch size,
gradient clipping and machine (the store's fingerprint: the GPU, the driver, torch, triton and
gputune's code), its first losses (`losses.json`, read by the search, which imports no torch)
and a sketch of its first-step gradients (`gradients.pt`, written and read by the workers,
`gradients.sketch`). A search, a second search and the dashboard's runs of the same workload on
the same machine then run the fp32 reference once between them, instead of once per trial.

An entry is a folder under `$GPUTUNE_HOME/references/`, named by a hash of its key, written
atomically file by file; an entry that cannot be read is computed again. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Mapping

from strategies.files import WriteError, gputune_home, write_atomic
from tuner_tui.engine.store import canonical_json, fingerprint

LOSSES = "losses.json"
GRADIENTS = "gradients.pt"
LOSS_SPREAD = "loss-spread.json"


class ReferenceCache:
    """The folder of reference entries (`$GPUTUNE_HOME/references` unless given)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else gputune_home() / "references"
        self.passes = 0
        """Reference losses this process wrote (a test counts them: one per key)."""

    def entry(self, workload_key: str, environment: Mapping, batch_size: int,
              grad_clip: float) -> Path:
        """The folder of one reference: created on demand by `save_losses` or a worker."""
        key = canonical_json({"workload": workload_key, "machine": fingerprint(environment),
                              "batch_size": batch_size, "grad_clip": grad_clip})
        return self.root / hashlib.sha256(key.encode()).hexdigest()[:24]

    def losses(self, entry: Path) -> tuple[float, ...] | None:
        """The stored losses, or None where there are none (or they cannot be read)."""
        try:
            data = json.loads((entry / LOSSES).read_text())
            losses = tuple(float(x) for x in data["losses"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return losses if losses and all(math.isfinite(x) for x in losses) else None

    def save_losses(self, entry: Path, losses: tuple[float, ...], label: str) -> bool:
        """Keep the losses a reference run measured; False (and nothing kept) where the folder
        cannot be written: the search goes on with the losses in memory."""
        if not losses or not all(math.isfinite(x) for x in losses):
            return False
        try:
            entry.mkdir(parents=True, exist_ok=True)
            write_atomic(entry / LOSSES, json.dumps({"losses": list(losses), "from": label}))
        except (OSError, WriteError):
            return False
        self.passes += 1
        return True

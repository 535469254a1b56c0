"""What the search's tests share: the machines' capabilities, and a trial's row."""

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine.protocol import TrialResult

CPU = Capabilities(device="cpu", cuda=False, bf16=True, triton=False)
GPU = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, gpu_name="NVIDIA H200",
                   fp8=True)
MiB = 2**20
MEMORY_LEVERS_HELD = {"weights": "fp32", "optimizer_state": "fp32", "fp8": "off",
                      "micro_batch_size": 0}
"""Held where a test is about the other stages: the memory levers have their own tests
(test_memory_model.py)."""


def row_of(tokens_per_s=None, peak=None, status="ok", **config) -> TrialResult:
    c = TuneConfig.from_dict(config)
    return TrialResult(config=c.to_dict(), label=c.label(), status=status,
                       tokens_per_s=tokens_per_s, peak_memory_bytes=peak,
                       loss_ok=True if status == "ok" else None)

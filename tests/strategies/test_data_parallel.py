"""The data parallel strategy in a user's own script: refused without a process group, and run
under torchrun (2 processes, gloo) as the user guide says, on a model that is not one of ours."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import strategies
from strategies import ConfigError, TuneConfig

ROOT = Path(__file__).resolve().parents[2]
TEARDOWN_ABORT = "terminate called without an active exception"

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from torch import nn
    import strategies

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # NORM=batch: each block normalizes with running statistics (BatchNorm)
            norm = nn.BatchNorm1d if os.environ.get("NORM") == "batch" else nn.Identity
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), norm(16), nn.Tanh())
                                        for _ in range(3))
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return self.head(x)

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tuned = strategies.apply(strategies.load(sys.argv[1]), model, optimizer)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(4):
        x = torch.randn(8, 16, generator=g)
        y = x[:, :4].argmax(1)
        rows = slice(rank * 8 // world, (rank + 1) * 8 // world)   # this rank's slice
        with tuned.autocast():
            loss = nn.functional.cross_entropy(tuned.model(x[rows]), y[rows])
        tuned.step(loss)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    if rank == 0:
        print(json.dumps({"losses": losses, "report": tuned.report["data_parallel"]}))
    dist.barrier()  # no rank tears gloo down while a peer is still in a collective
    dist.destroy_process_group()
''')


def test_without_a_process_group_a_parallel_config_is_refused_in_one_line():
    model = nn.Linear(4, 4)
    with pytest.raises(ConfigError, match="parallel = ddp needs a torch.distributed process group"):
        strategies.apply(TuneConfig.from_dict({"parallel": "ddp", "devices": 2}), model)


def _torchrun(tmp_path, config: dict, nproc: int, **env_vars: str) -> dict:
    path = tmp_path / "gputune.toml"
    strategies.save(TuneConfig.from_dict(config), path)
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env_vars}
    for attempt in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={nproc}", str(tmp_path / "train.py"), str(path)],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )
        # torch 2.13's gloo can abort a rank while it tears down (a C++ thread left unjoined:
        # seen once in CI, not reproduced in 25 runs here under load). That abort,
        # and only it, gets one more run; any other failure fails at once.
        if proc.returncode == 0 or TEARDOWN_ABORT not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_exported_config_trains_under_torchrun_like_one_process(tmp_path):
    """FSDP2 here (the harder one: the optimizer must follow the sharded parameters); DDP and
    FSDP2 are both checked against one process in gputune's own groups (tests/engine)."""
    one = _torchrun(tmp_path, {}, nproc=1)
    two = _torchrun(tmp_path, {"parallel": "fsdp2", "devices": 2}, nproc=2)
    assert one["report"] == {"parallel": "none"}
    assert two["report"]["world_size"] == 2
    assert two["report"]["blocks"] == 3  # fully_shard on each repeated block, then the root
    # fp32: the sharded reduction sums in another order than one backward pass.
    assert torch.allclose(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-4)


def test_fsdp2_with_bf16_weights_trains_a_model_with_batchnorm(tmp_path):
    """A BatchNorm keeps fp32 parameters beside its fp32 running statistics (bf16 weights cast
    the rest): FSDP2 gathers one dtype per group, so each becomes a group of its own, gathered
    in fp32. Both bf16 autocast (FSDP2 gathering bf16) and bf16 weights crashed without it."""
    fp32 = _torchrun(tmp_path, {"parallel": "fsdp2", "devices": 2}, nproc=2, NORM="batch")
    half = _torchrun(tmp_path, {"parallel": "fsdp2", "devices": 2, "precision": "bf16",
                                "weights": "bf16"}, nproc=2, NORM="batch")
    assert half["report"]["fp32_groups_beside_running_statistics"] == 3
    assert half["report"]["param_dtype"] == "bfloat16"
    assert torch.allclose(torch.tensor(half["losses"]), torch.tensor(fp32["losses"]), rtol=0.05)

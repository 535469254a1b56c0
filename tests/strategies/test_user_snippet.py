"""The README's five-line snippet, run as written on a plain model that is not one of ours."""

import re
from pathlib import Path

import torch
from torch import nn

import strategies
from strategies import TuneConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    text = README.read_text()
    match = re.search(r"<!-- apply-snippet -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README has no apply snippet"
    return match.group(1)


class UserNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_snippet_adds_at_most_five_lines_to_a_training_loop():
    ours = [ln for ln in readme_snippet().splitlines() if "strategies" in ln or "tuned" in ln]
    assert 0 < len(ours) <= 5, ours


def test_readme_snippet_trains_a_foreign_model(tmp_path, monkeypatch):
    config = TuneConfig.from_dict({"precision": "bf16", "checkpointing": "full", "optimizer": "foreach"})
    strategies.save(config, tmp_path / "gputune.toml")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = UserNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=g)
    y = x[:, :5].argmax(1)
    snippet = readme_snippet()
    # The loop body of the snippet runs once per step.
    setup, _, body = snippet.partition("for x, y in batches:\n")
    scope = {"model": model, "optimizer": optimizer, "loss_fn": loss_fn}
    exec(setup, scope)
    tuned = scope["tuned"]
    assert tuned.report["checkpointing"]["blocks"] == 3
    assert tuned.optimizer.param_groups[0]["foreach"] is True
    losses = []
    for _ in range(30):
        scope.update(x=x, y=y)
        exec(_dedent(body), scope)
        losses.append(scope["loss"].item())
    assert losses[-1] < losses[0] * 0.7, losses


def _dedent(block: str) -> str:
    import textwrap

    return textwrap.dedent(block)


def test_readme_accumulation_snippet_gives_the_whole_batch_gradients(tmp_path, monkeypatch):
    text = README.read_text()
    match = re.search(r"<!-- accumulate-snippet -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README has no accumulation snippet"
    snippet = "import strategies\n" + match.group(1)
    strategies.save(TuneConfig.from_dict({"micro_batch_size": 4, "grad_clip": 0.0}),
                    tmp_path / "gputune.toml")
    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 32, generator=g)
    batches = [(x, x[:, :5].argmax(1))]
    loss_fn = nn.CrossEntropyLoss()

    torch.manual_seed(0)
    whole = UserNet()
    whole_opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    loss_fn(whole(batches[0][0]), batches[0][1]).backward()
    whole_opt.step()

    torch.manual_seed(0)
    model = UserNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = {"model": model, "optimizer": optimizer, "loss_fn": loss_fn, "batches": batches}
    exec(snippet, scope)
    assert scope["tuned"].accumulation_steps == 4
    # One SGD step on the accumulated gradients lands where the whole batch's step does.
    for a, b in zip(model.parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

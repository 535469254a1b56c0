"""The README's five-line snippet (and the guide's micro-batch one), run as written on a plain
model that is not one of ours."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import strategies
from strategies import TuneConfig

README = Path(__file__).resolve().parents[2] / "README.md"
GUIDE = README.parent / "docs" / "guide.md"


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


NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def test_the_snippet_is_as_long_as_the_readme_says():
    """Every line of the snippet is one the README counts, except the user's own ("as before")."""
    text = README.read_text()
    said = re.search(r"add these (\w+) lines to your loop", text)
    assert said, "README does not say how many lines the snippet adds"
    added = [ln for ln in readme_snippet().splitlines() if ln.strip() and "# as before" not in ln]
    assert len(added) == NUMBERS[said.group(1)] <= 5, added
    assert all("gputune" in ln or "tuned" in ln for ln in added), added


def test_readme_snippet_trains_a_foreign_model(tmp_path, monkeypatch):
    config = TuneConfig.from_dict({"precision": "bf16", "checkpointing": "full", "optimizer": "foreach"})
    strategies.save(config, tmp_path / "gputune.toml")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = UserNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=g)
    y = x[:, :5].argmax(1)
    snippet = readme_snippet()
    # The loop body of the snippet runs once per step.
    setup, _, body = re.split(r"^(for x, y in batches:.*\n)", snippet, maxsplit=1, flags=re.M)
    scope = {"model": model, "optimizer": optimizer, "loss_fn": loss_fn, "scheduler": scheduler}
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
    # The scheduler made before apply halved the rate of the optimizer that stepped, three times.
    assert tuned.optimizer is optimizer
    assert tuned.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 / 8)


def _dedent(block: str) -> str:
    import textwrap

    return textwrap.dedent(block)


def test_the_guides_accumulation_snippet_gives_the_whole_batch_gradients(tmp_path, monkeypatch):
    text = GUIDE.read_text()
    match = re.search(r"<!-- accumulate-snippet -->\s*```python\n(.*?)```", text, re.S)
    assert match, "the guide has no accumulation snippet"
    snippet = "import gputune\n" + match.group(1)
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

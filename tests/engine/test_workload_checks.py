"""What a workload is checked for before any trial: the fields of the `Workload` a user's
function returns, its first batch, a --seq-len no memory could hold, a function that never
returns; and what identifies it in the result store (its code, not only its name)."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner_tui.engine import workloads
from tuner_tui.engine.store import workload_key
from tuner_tui.engine.workloads import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
USER = "tests.engine.user_workloads"


@pytest.mark.parametrize("function, words", [
    ("negative_items", "items_per_sample = -5 is not allowed: an integer from 1 to 2147483648"),
    ("zero_batch", "default_batch_size = 0 is not allowed: an integer from 1 to 1048576"),
])
def test_a_workload_with_nonsense_figures_is_refused(function, words):
    with pytest.raises(WorkloadError, match=words):
        workloads.load(f"{USER}:{function}")


def test_a_model_that_is_not_a_module_is_an_invalid_row_not_a_crash():
    from tuner_tui.engine.trial import classify

    workload = workloads.load(f"{USER}:builds_nothing")
    with pytest.raises(WorkloadError, match="build_model returned NoneType") as caught:
        workload.build_model()
    assert classify(caught.value) == "invalid"


def test_a_first_batch_of_nothing_is_refused():
    workload = workloads.load(f"{USER}:no_first_batch")
    with pytest.raises(WorkloadError, match=r"its batch\(0, 32, cpu\) returned None"):
        workloads.check_first_batch(workload, "w", "cpu")


def test_a_sequence_whose_logits_alone_exceed_memory_is_refused_with_the_most_allowed():
    with pytest.raises(WorkloadError, match=r"--seq-len 16777216 is too long for llama-1b here: "
                                            r"one sequence's logits alone take .* allowed here: "
                                            r"up to \d+"):
        workloads.load("llama-1b", seq_len=2**24)


def test_a_user_workload_is_keyed_by_its_code_not_only_its_name(tmp_path, monkeypatch):
    """Two functions reporting the same name, or one edited, never share stored results."""
    module = tmp_path / "my_models.py"
    module.write_text(textwrap.dedent("""
        from tests.engine.user_workloads import tiny_mlp

        def first():
            return tiny_mlp()

        def second():
            return tiny_mlp()  # the same name, "tiny-mlp"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))

    def key(function: str) -> str:
        described = workloads.load(f"my_models:{function}").describe()
        return workload_key({**described, "seed": 0, "data": None})

    first, second = key("first"), key("second")
    assert first.startswith("tiny-mlp ") and "my_models.first@" in first
    assert first != second
    module.write_text(module.read_text() + "\n# edited: another model\n")
    assert key("first") != first
    assert workload_key({**workloads.load("gpt2-tiny").describe(), "seed": 0, "data": None}) == \
        "gpt2-tiny seq=64 seed=0 synthetic"  # the built-ins' code is in the code hash


def _gputune(*args, cwd=ROOT, env=None, launcher=None):
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "pythonpath")])
    command = [launcher] if launcher else ["-m", "tuner_tui.cli"]
    return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


def test_a_workload_that_never_returns_is_stopped_saying_where_it_waited(tmp_path):
    start = time.monotonic()
    proc = _gputune("bench", "--device", "cpu", "--workload", f"{USER}:sleeps",
                    env={"GPUTUNE_WORKLOAD_TIMEOUT": "2", "GPUTUNE_HOME": str(tmp_path)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"workload '{USER}:sleeps' did not return within 2 s" in lines[0]
    assert "user_workloads.py:" in lines[0] and "in sleeps" in lines[0]
    assert "GPUTUNE_WORKLOAD_TIMEOUT sets the limit" in lines[0]
    assert time.monotonic() - start < 60

"""The xdist groups of the tests that share one real run (`--dist loadgroup`, pyproject.toml):
the tests marked `pytest.mark.xdist_group(NAME)` with one of these names run in one pytest
process, so the run they share (a fixture of tests/engine/conftest.py) is made once."""

SHARED_GPT2_WORKER = "shared-gpt2-tiny-worker"
"""The tests that take `gpt2_worker` or `group_trials`: one gpt2-tiny worker, started once (a
worker's start, importing torch and building the workload, was most of what each of them cost
when each started its own)."""

QUICK_BENCH = "bench-quick-profiled-on-a-text-file"
"""The tests that assert on `quick_bench`'s run."""

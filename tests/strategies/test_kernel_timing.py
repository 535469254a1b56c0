"""The fused-kernels strategy keeps a kernel only where it is measured no slower than the module it
replaces: timings cached per machine and code, the decision and its report, the forced swap.

On the CPU the timings are real (Triton's interpreter against torch), or read from a cache file
written here with known contents; the GPU test at the end measures on the GPU at hand."""

import functools
import json

import pytest
import torch
from torch import nn

import strategies
from strategies import TuneConfig, fused_kernels, kernel_timing
from strategies.compose import TunedRun
from strategies.kernel_timing import Timing, TimingCache, machine_key, time_case, verdict
from strategies.code_version import code_hash
from tuner_tui.engine.workloads import load

MACHINE = {"gpu": "NVIDIA H200", "driver": "570.86", "torch": "2.13.0", "triton": "3.5.0",
           "code": "0123456789abcdef"}
quick = functools.partial(time_case, warmup=1, reps=3)


@pytest.fixture(autouse=True)
def _kernels_run_here():
    import gputune_kernels

    if not gputune_kernels.available()[0]:
        pytest.skip("Triton kernels cannot run here")


def _gpt_run(config: TuneConfig) -> TunedRun:
    torch.manual_seed(0)
    model = load("gpt2-tiny").build_model()
    return TunedRun(config, model, None, "cpu")


def _cases(run: TunedRun, kernels, rows=8):
    found = fused_kernels.first_replacements(run.model, set(kernels))
    return [kernel_timing.make_case(k, *found[k], run.model, run.autocast_dtype).with_rows(rows)
            for k in kernels]


class Counted:
    """The real measurement, counting its calls."""

    def __init__(self):
        self.measured = []

    def __call__(self, case):
        self.measured.append(case.key)
        return quick(case)


def test_the_cache_measures_once_and_reuses_what_it_stored(tmp_path):
    run = _gpt_run(TuneConfig())
    cases = _cases(run, ["layer_norm", "gelu"])
    path, measure = tmp_path / "kernel_timings.json", Counted()
    first = TimingCache(path, MACHINE).timings(cases, measure)
    assert sorted(measure.measured) == sorted(c.key for c in cases)
    assert all(isinstance(t, Timing) and t.ours_ms > 0 and t.torch_ms > 0 for t in first.values())
    stored = json.loads(path.read_text())["machines"][machine_key(MACHINE)]["timings"]
    assert set(stored) == {c.key for c in cases}

    again = TimingCache(path, MACHINE).timings(cases, measure)
    assert len(measure.measured) == 2  # nothing timed the second time
    assert again == first


@pytest.mark.parametrize("changed", [{"gpu": "NVIDIA A100-SXM4-80GB"}, {"code": "fedcba9876543210"}])
def test_another_gpu_or_code_version_is_measured_again(tmp_path, changed):
    run = _gpt_run(TuneConfig())
    cases = _cases(run, ["gelu"])
    path, measure = tmp_path / "kernel_timings.json", Counted()
    TimingCache(path, MACHINE).timings(cases, measure)
    other = {**MACHINE, **changed}
    assert machine_key(other) != machine_key(MACHINE)
    TimingCache(path, other).timings(cases, measure)
    assert len(measure.measured) == 2
    TimingCache(path, MACHINE).timings(cases, measure)  # the first machine's entry is still there
    assert len(measure.measured) == 2
    assert len(json.loads(path.read_text())["machines"]) == 2


def test_the_machine_is_keyed_by_the_code_version():
    here = kernel_timing.machine_here(torch.device("cpu"))
    assert here["code"] == code_hash()
    assert set(here) == {"gpu", "driver", "torch", "triton", "code"}
    assert here["torch"] == torch.__version__


def test_the_case_key_names_kernel_module_shape_and_dtypes():
    run = _gpt_run(TuneConfig())
    run.autocast_dtype = torch.bfloat16
    gelu, layer_norm = _cases(run, ["gelu", "layer_norm"], rows=16)
    # gpt2-tiny: width 64, MLP width 256; the norms see the fp32 residual stream.
    assert gelu.key == "gelu GELU 16x256 bfloat16 autocast bfloat16"
    assert layer_norm.key == "layer_norm LayerNorm 16x64 float32 autocast bfloat16"


def test_a_damaged_cache_file_is_measured_again_and_rewritten(tmp_path):
    path = tmp_path / "kernel_timings.json"
    path.write_text("{not json")
    cases = _cases(_gpt_run(TuneConfig()), ["gelu"])
    measure = Counted()
    TimingCache(path, MACHINE).timings(cases, measure)
    assert len(measure.measured) == 1
    assert cases[0].key in json.loads(path.read_text())["machines"][machine_key(MACHINE)]["timings"]


def test_timing_leaves_the_random_state_and_the_gradients_alone():
    run = _gpt_run(TuneConfig())
    cases = _cases(run, ["layer_norm"])
    before = torch.random.get_rng_state()
    quick(cases[0])
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(p.grad is None for p in run.model.parameters())


def test_a_kernel_measured_slower_on_the_cpu_is_left_and_the_report_says_why():
    # Real timings: Triton's interpreter is far slower than torch's own GELU on the CPU.
    config = TuneConfig.from_dict({"fused_kernels": ["gelu"]})
    run = _gpt_run(config)

    def on_the_cpu(cases):
        return {c.kernel: quick(c.with_rows(64)) for c in cases}

    fused_kernels.apply(run, config, timings=on_the_cpu)
    line = run.report["fused_kernels_measured"]["gelu"]
    assert line.startswith("left, ") and " ms vs torch " in line
    assert run.report["fused_kernels_timing_s"] > 0  # (what the build spent timing kernels)
    assert run.report["fused_kernels"] == {"gelu": 0}
    assert any(isinstance(m, nn.GELU) for m in run.model.modules())


def _recorded(tmp_path, run, kernels, figures):
    """A cache file as a GPU would have written it, with known timings."""
    cases = _cases(run, kernels, rows=kernel_timing.ROWS)
    timings = {c.key: {"ours_ms": figures[c.kernel][0], "torch_ms": figures[c.kernel][1]}
               for c in cases}
    path = tmp_path / "kernel_timings.json"
    path.write_text(json.dumps({"format": 1, "machines": {machine_key(MACHINE): {
        "machine": MACHINE, "written": "2026-12-01T00:00:00+00:00", "timings": timings}}}))
    return path


RECORDED = {"layer_norm": (0.68, 0.18), "gelu": (0.12, 0.24)}


@pytest.mark.parametrize("policy", ["inductor-first", "forced"])
def test_the_recorded_timings_decide_which_kernels_are_swapped(tmp_path, policy):
    config = TuneConfig.from_dict({"fused_kernels": ["layer_norm", "gelu", "linear_cross_entropy"],
                                   "kernels_with_compile": policy})
    run = _gpt_run(config)
    path = _recorded(tmp_path, run, ["layer_norm", "gelu"], RECORDED)
    written = path.read_bytes()

    def recorded(cases):
        return TimingCache(path, MACHINE).timings(cases)

    fused_kernels.apply(run, config, timings=recorded)
    assert path.read_bytes() == written  # every timing came from the file
    lines = run.report["fused_kernels_measured"]
    assert lines["gelu"] == "kept, 0.12 ms vs torch 0.24 ms"
    assert lines["linear_cross_entropy"].startswith("kept, not timed: its point is memory")
    if policy == "forced":
        assert lines["layer_norm"] == "kept (forced), 0.68 ms vs torch 0.18 ms"
        assert run.report["fused_kernels"] == {"layer_norm": 5, "gelu": 2, "linear_cross_entropy": 1}
    else:
        assert lines["layer_norm"] == "left, 0.68 ms vs torch 0.18 ms"
        assert run.report["fused_kernels"] == {"layer_norm": 0, "gelu": 2, "linear_cross_entropy": 1}
        assert sum(isinstance(m, nn.LayerNorm) for m in run.model.modules()) == 5


def test_within_the_margin_a_kernel_counts_as_no_slower():
    assert verdict(Timing(0.185, 0.18))[0]
    assert not verdict(Timing(0.19, 0.18))[0]
    assert verdict("OutOfMemoryError: CUDA out of memory") == (
        True, "kept, not timed: OutOfMemoryError: CUDA out of memory")


def test_on_the_cpu_nothing_is_timed_by_default():
    config = TuneConfig.from_dict({"fused_kernels": ["layer_norm", "gelu"]})
    run = _gpt_run(config)
    fused_kernels.apply(run, config)
    assert run.report["fused_kernels"] == {"layer_norm": 5, "gelu": 2}
    assert "fused_kernels_measured" not in run.report
    assert "fused_kernels_timing_s" not in run.report


@pytest.mark.gpu
def test_on_the_gpu_the_measured_decision_is_made_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    kernels = ["layer_norm", "gelu", "causal_softmax", "cross_entropy"]
    config = TuneConfig.from_dict({"precision": "bf16", "fused_kernels": kernels})

    def applied():
        torch.manual_seed(0)
        model = load("gpt2-124m").build_model().cuda()
        return strategies.apply(config, model)

    first = applied()
    path = tmp_path / "kernel_timings.json"
    written = path.read_bytes()
    lines = first.report["fused_kernels_measured"]
    assert set(lines) == set(kernels)
    assert first.report["fused_kernels_native_wait_s"] >= 0
    for kernel, line in lines.items():
        assert line.startswith(("kept, ", "left, ")) and " ms vs torch " in line, line
        assert (first.report["fused_kernels"][kernel] == 0) == line.startswith("left, ")
    second = applied()
    assert path.read_bytes() == written
    assert second.report["fused_kernels_measured"] == lines

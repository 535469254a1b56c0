"""The session model and the pure rendering helpers, without an app."""

from __future__ import annotations

import math

from strategies.config import TuneConfig
from tuner_tui import format as fmt
from tuner_tui.app.session import Session
from tuner_tui.app.widgets.bars import bar
from tuner_tui.app.widgets.leaderboard import sorted_rows
from tuner_tui.app.widgets.plot import braille_lines, bucket, value_range
from tuner_tui.engine import protocol

from tui_fakes import CPU_CAPS, WORKLOAD


def ready() -> protocol.WorkerReady:
    return protocol.WorkerReady(7, CPU_CAPS.to_dict(), {"torch": "2.13"}, dict(WORKLOAD))


def step(run_id: int, i: int, tokens: float = 1000.0, loss: float = 3.0) -> protocol.StepMeasured:
    return protocol.StepMeasured(run_id, i, 8.0, tokens, loss, 0.1, 1, 2, 0.0)


def result(label: str, tokens: float | None, status: str = "ok") -> protocol.TrialResult:
    return protocol.TrialResult(config=TuneConfig().to_dict(), label=label, status=status, tokens_per_s=tokens)


def test_runs_steps_markers_and_rows():
    s = Session()
    s.worker_started(7)
    for e in (ready(), protocol.RunStarted(1, TuneConfig(), "fp32", 8), step(1, 0), step(1, 1),
              protocol.TrialFinished(1, result("fp32", 1000.0)),
              protocol.RunStarted(2, TuneConfig(), "bf16", 8), step(2, 0, 2500.0),
              protocol.TrialFinished(2, result("bf16", 2500.0))):
        s.apply(e, now=0.0)
    assert s.capabilities == CPU_CAPS
    assert [m.position for m in s.markers] == [0, 2]
    assert [m.number for m in s.markers] == [1, 2]
    assert [r.number for r in s.rows] == [1, 2]
    assert s.change_vs_baseline(s.rows[1]) == 2.5
    assert list(s.throughput.values) == [1000.0, 1000.0, 2500.0]


def test_stragglers_from_a_replaced_run_are_ignored():
    s = Session()
    s.apply(protocol.RunStarted(2, TuneConfig(), "bf16", 8), 0.0)
    s.apply(step(1, 5), 0.0)
    assert len(s.throughput) == 0


def test_compile_time_is_counted_from_the_ui_clock():
    s = Session()
    s.apply(protocol.RunStarted(1, TuneConfig(), "compile", 8), 0.0)
    s.apply(protocol.CompileStarted(1), 10.0)
    assert s.compiling_for(13.5) == 3.5
    s.apply(protocol.CompileFinished(1, 3.6), 13.6)
    assert s.compiling_for(20.0) is None and s.compile_s == 3.6


def test_failure_after_measurement_updates_the_same_row():
    s = Session()
    s.apply(protocol.RunStarted(1, TuneConfig(), "fp16", 8), 0.0)
    s.apply(protocol.TrialFinished(1, result("fp16", 3000.0)), 0.0)
    s.apply(protocol.RunFailed(1, "diverged", "loss is nan at step 40"), 0.0)
    assert len(s.rows) == 1
    assert s.rows[0].result.status == "diverged" and s.rows[0].result.tokens_per_s == 3000.0
    assert s.baseline is None  # a diverged run is never the reference


def test_a_dead_worker_turns_the_run_in_flight_into_a_crash_row_and_run_ids_restart():
    s = Session()
    s.worker_started(7)
    s.apply(protocol.RunStarted(1, TuneConfig.from_dict({"precision": "bf16"}), "bf16", 8), 0.0)
    message = s.worker_died(-9)
    assert "SIGKILL" in message
    assert s.rows[0].result.status == "crash" and s.worker_state == "dead"
    s.worker_started(8)
    s.apply(protocol.RunStarted(1, TuneConfig(), "fp32", 8), 0.0)  # the new worker counts from 1 again
    s.apply(protocol.TrialFinished(1, result("fp32", 900.0)), 0.0)
    assert [r.result.status for r in s.rows] == ["crash", "ok"]
    assert [r.number for r in s.rows] == [1, 2]


def test_pause_restores_the_previous_state():
    s = Session()
    s.apply(protocol.RunStarted(1, TuneConfig(), "x", 8), 0.0)
    s.apply(protocol.Paused(), 0.0)
    assert s.worker_state == "paused"
    s.apply(protocol.Resumed(), 0.0)
    assert s.worker_state == "running"


def test_sorting_puts_unknown_figures_last_both_ways():
    s = Session()
    for i, (tokens, status) in enumerate(((1000.0, "ok"), (None, "oom"), (3000.0, "ok")), start=1):
        s.apply(protocol.RunStarted(i, TuneConfig(), f"r{i}", 8), 0.0)
        s.apply(protocol.TrialFinished(i, result(f"r{i}", tokens, status)), 0.0)
    assert [r.number for r in sorted_rows(s, "tokens", reverse=True)] == [3, 1, 2]
    assert [r.number for r in sorted_rows(s, "tokens", reverse=False)] == [1, 3, 2]


def test_bucket_and_range():
    assert bucket([1.0, 2.0, 3.0], 5) == ([1.0, 2.0, 3.0], [True, True, True])
    assert bucket([1.0, 3.0, 5.0, 7.0], 2)[0] == [2.0, 6.0]
    assert math.isnan(bucket([math.nan, math.nan, 1.0, 1.0], 2)[0][0])
    # A bucket with steady points averages those only; one without is marked unsteady.
    assert bucket([90.0, 1.0, 2.0, 2.0], 2, [False, True, True, True]) == ([1.0, 2.0], [True, True])
    assert bucket([90.0, 80.0, 2.0, 2.0], 2, [False, False, True, True]) == ([85.0, 2.0], [False, True])
    assert value_range([5.0, 10.0], zero_based=True)[0] == 0.0
    lo, hi = value_range([2.0, 2.0], zero_based=False)
    assert lo < 2.0 < hi


def test_the_axis_scales_to_the_steady_steps_not_an_early_spike():
    # The case: a 22.4k spike of the first steps over a steady 0.5-1.4k.
    values = [22_400.0, 9_000.0, 800.0, 1_400.0, 500.0, 1_100.0]
    steady = [False, False, True, True, True, True]
    lo, hi = value_range(values, zero_based=True, steady=steady)
    assert lo == 0.0 and 1_400.0 < hi < 1_500.0
    cells, clipped = braille_lines(values, width=3, height=2, lo=lo, hi=hi)
    assert (0, 0) in clipped  # the spike is drawn at the top edge, marked
    assert value_range(values[:2], zero_based=True, steady=steady[:2])[1] > 22_400.0  # none steady


def test_braille_line_is_continuous_and_skips_nan():
    cells, _ = braille_lines([0.0, 1.0, math.nan, 0.0], width=2, height=1, lo=0.0, hi=1.0)
    # Column 0: a rise from bottom to top fills the whole second dot column.
    assert cells[0][0] & 0x80 and cells[0][0] & 0x08
    # After the NaN, the last point stands alone at the bottom of column 1, right dot column.
    assert cells[0][1] == 0x80


def test_formats():
    assert fmt.rate(12345.0) == "12.3k" and fmt.rate(None) == "—" and fmt.rate(1.5e6) == "1.5M"
    assert fmt.size(1536 * 1024**2) == "1.5 GiB" and fmt.size(512) == "512 B"
    assert fmt.speedup(1.234) == "×1.23"
    assert fmt.seconds(75) == "1m15s" and fmt.seconds(3.21) == "3.2s"
    assert fmt.loss(float("nan")) == "nan"
    assert bar(0.5, 4).plain == "██░░" and bar(None, 3).plain == "···"


def test_the_step_that_compiled_and_the_warm_up_are_plotted_but_not_steady():
    s = Session()
    s.apply(protocol.RunStarted(1, TuneConfig(), "compile", 8, warmup_steps=2), 0.0)
    s.apply(protocol.CompileStarted(1, "torch.compile"), 0.0)
    assert s.compile_what == "torch.compile"
    s.apply(protocol.StepMeasured(1, 0, 15000.0, 1.0, 3.0, None, 1, 2, 0.0), 15.0)
    s.apply(protocol.CompileFinished(1, 15.0), 15.0)
    for i in (1, 2, 3):
        s.apply(step(1, i), 15.1)
    assert list(s.step_ms.values) == [15000.0, 8.0, 8.0, 8.0]
    assert list(s.step_ms.steady) == [False, False, True, True]
    assert s.last_step.step == 3 and s.run_times == [8.0, 8.0]


def test_the_panel_and_the_leaderboard_share_the_rate_the_change_and_the_peak():
    s = Session()
    s.worker_started(7)
    s.apply(ready(), 0.0)
    base = protocol.TrialResult(config=TuneConfig().to_dict(), label="fp32", status="ok",
                                tokens_per_s=1000.0, peak_memory_bytes=16 << 20)
    s.apply(protocol.RunStarted(1, TuneConfig(), "fp32", 8, warmup_steps=1), 0.0)
    s.apply(protocol.TrialFinished(1, base), 0.0)
    s.apply(protocol.RunStarted(2, TuneConfig(), "bf16", 8, warmup_steps=1), 0.0)
    for i, tokens in enumerate((9000.0, 640.0, 660.0, 650.0)):  # a fast outlier in the warm-up
        s.apply(protocol.StepMeasured(2, i, 8.0, tokens, 3.0, None, 1, 20 << 20, 0.0), 0.0)
    rate, measured = s.current_rate()
    assert (rate, measured) == (650.0, False) and s.change(rate) == 0.65
    assert s.current_peak() == (20 << 20, False)
    tuned = protocol.TrialResult(config=TuneConfig().to_dict(), label="bf16", status="ok",
                                 tokens_per_s=640.0, peak_memory_bytes=16 << 20,
                                 peak_reserved_bytes=18 << 20)
    s.apply(protocol.TrialFinished(2, tuned), 0.0)
    # After the row: its figures, whatever later steps (a profile's own buffers) report.
    s.apply(protocol.StepMeasured(2, 9, 8.0, 700.0, 3.0, None, 1, 90 << 20, 0.0), 0.0)
    assert s.current_rate() == (640.0, True)
    assert s.change(640.0) == s.change_vs_baseline(s.rows[1]) == 0.64
    assert s.current_peak() == (18 << 20, True)  # the larger of allocated and reserved


def test_screenshot_tool_parses_configurations():
    import pytest

    from strategies.config import ConfigError
    from tuner_tui.app.screenshot import parse_config

    c = parse_config("precision=bf16,fused_kernels=layer_norm+gelu,compile_fullgraph=true,compile_mode=default")
    assert c.precision == "bf16" and c.fused_kernels == ("layer_norm", "gelu") and c.compile_fullgraph
    with pytest.raises(ConfigError):
        parse_config("nope=1")


def test_screenshot_tool_refuses_a_budget_that_is_not_a_size(capsys):
    from tuner_tui.app.screenshot import main

    assert main(["--max-memory", "lots"]) == 2  # before any worker starts
    assert "lots" in capsys.readouterr().err


def test_gpu_panel_text_one_block_per_gpu_or_one_line_each():
    from tuner_tui.app.widgets.gpu_panel import describe_gpu, describe_gpu_line
    from tuner_tui.engine.telemetry import GpuSample

    gpu = GpuSample(3, "NVIDIA H200", 87.0, 61 << 30, 141 << 30, 512.0, 700.0, 61.0, 1980, 1980, 78.0, 44.0)
    block = describe_gpu(gpu).plain
    for expected in ("GPU 3 NVIDIA H200", "87%", "61 GiB / 141 GiB", "512 / 700 W", "61°C", "1980/1980 MHz", "tensor 44%"):
        assert expected in block
    line = describe_gpu_line(gpu).plain
    assert line.startswith("3 ") and "512W" in line and "tc 44%" in line and "\n" not in line
    bare = describe_gpu(GpuSample(0, "T4", gpm_note="GPM: not supported on this GPU (Hopper or later)")).plain
    assert "— / — W" in bare and "GPM: not supported" in bare


def test_a_run_refused_before_it_started_is_a_row_but_a_failed_setup_is_not():
    s = Session()
    s.apply(protocol.RunFailed(0, "invalid", "unknown workload 'x'"), 0.0)
    assert s.rows == []
    s.apply(protocol.RunStarted(1, TuneConfig(), "fp32", 8), 0.0)
    s.apply(protocol.TrialFinished(1, result("fp32", 1000.0)), 0.0)
    s.applying({"precision": "fp16"}, "fp16")
    s.apply(protocol.RunFailed(2, "invalid", "precision = fp16 needs a CUDA GPU"), 0.0)
    assert [(r.number, r.result.label, r.result.status) for r in s.rows] == [(1, "fp32", "ok"), (2, "fp16", "invalid")]
    assert s.worker_state == "idle"  # the worker waits for a command, not "applying" forever
    s.apply(protocol.RunStarted(3, TuneConfig(), "bf16", 8), 0.0)
    assert s.markers[-1].number == 3


def test_a_group_step_shows_each_rank_and_the_split_batch():
    from rich.console import Console

    from tuner_tui.app.widgets.figures import figures_table

    s = Session()
    group_step = protocol.StepMeasured(1, 3, 9.5, 1000.0, 3.0, None, 1, 2, 0.0,
                                       rank_step_ms=(9.1, 9.5))
    for e in (ready(), protocol.RunStarted(1, TuneConfig.from_dict({"parallel": "ddp", "devices": 2}), "ddp x2", 8),
              group_step):
        s.apply(e, now=0.0)
    console = Console(width=100, record=True)
    console.print(figures_table(s, now=0.0))
    text = console.export_text()
    assert "rank ms  0:9.1  1:9.5" in text
    assert "(2 ranks × 4)" in text

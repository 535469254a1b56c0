"""An image model's rows speak of images/s everywhere the headless commands print or write."""

from tuner_tui.engine import protocol
from tuner_tui.engine.search.report import _rival_text
from tuner_tui.engine.table import format_table, summary


def _row(label, rate, item_name="images", **extra):
    return protocol.TrialResult(**{"config": {}, "label": label, "status": "ok",
                                   "tokens_per_s": rate, "step_ms": 1e3, "item_name": item_name,
                                   **extra})


def test_the_table_and_the_progress_line_name_the_workload_s_item():
    rows = [_row("fp32", 100.0), _row("bf16", 250.0)]
    header = format_table(rows).splitlines()[0]
    assert "images/s" in header and "tokens/s" not in header
    assert summary(rows[1]).startswith("250 images/s, 1000.0 ms/step")
    assert "samples/s" in format_table(rows, item_name="samples").splitlines()[0]
    # A row that ran nothing says nothing of the unit; the measured rows decide it.
    failed = protocol.TrialResult(config={}, label="fp16", status="oom")
    assert "images/s" in format_table([failed, *rows]).splitlines()[0]
    assert "tokens/s" in format_table([failed]).splitlines()[0]


def test_a_stored_row_without_an_item_name_reads_as_tokens():
    old = protocol.TrialResult.from_dict({"config": {}, "label": "fp32", "status": "ok",
                                          "tokens_per_s": 5.0, "step_ms": 2.0})
    assert old.item_name == "tokens" and summary(old).startswith("5 tokens/s")
    assert protocol.TrialResult.from_dict(_row("x", 1.0).to_dict()).item_name == "images"


def test_the_tune_report_names_the_item():
    top = _row("ddp", 200.0, config={"parallel": "ddp", "devices": 2}, peak_memory_bytes=1 << 30)
    rival = _row("fsdp2", 100.0, config={"parallel": "fsdp2", "devices": 2},
                 peak_memory_bytes=1 << 30)
    assert "100 images/s" in _rival_text(rival, top, budget=2 << 30, scope="")


def test_the_search_s_progress_line_names_the_workload_s_item(tmp_path):
    # (a vision model's search once printed "best 260 tokens/s" over its images/s table)
    import io

    from search_oracle import Oracle
    from simulated_search import simulate

    printed = io.StringIO()
    simulate(Oracle(0), tmp_path, 120.0, out=printed, item_name="images")
    lines = [ln for ln in printed.getvalue().splitlines() if ", best " in ln]
    assert lines and all("images/s" in ln and "tokens/s" not in ln for ln in lines)


def test_a_tune_report_whose_every_row_crashed_still_names_the_workload_s_item():
    # (a user's MLP whose every trial crashed was reported in tokens/s, not samples/s)
    from tuner_tui.engine.search.report import SearchOutcome, report
    from tuner_tui.engine.search.space import SearchSpace

    crashed = [protocol.TrialResult(config={}, label=label, status="crash", message="boom")
               for label in ("fp32", "bf16")]
    outcome = SearchOutcome(results=crashed, ranked=crashed, eligible=0, front=[],
                            recommendation=None, reason="no configuration finished",
                            environment={}, workload={"name": "mlp", "item_name": "samples"},
                            workload_key="mlp", space=SearchSpace(choices=()), budget_bytes=0)
    header = next(ln for ln in report(outcome).splitlines() if ln.startswith("#"))
    assert "samples/s" in header and "tokens/s" not in header

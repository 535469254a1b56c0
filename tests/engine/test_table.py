"""The bench/tune table as text: aligned, plain ASCII, never wrapped, labels verbatim."""

from tuner_tui.engine import protocol
from tuner_tui.engine.table import format_table, render_columns


def _result(label, tokens, status="ok"):
    return protocol.TrialResult(
        config={}, label=label, status=status, tokens_per_s=tokens, step_ms=1e6 / tokens if tokens else None,
        mfu=0.25 if tokens else None, peak_memory_bytes=(3 << 30) if tokens else None,
        mfu_peak_source="datasheet: test" if tokens else "",
    )


def test_numbers_align_right_text_left_and_nothing_wraps():
    long_label = "bf16 + sdpa + compile(reduce-overhead) + fused AdamW + [linear_cross_entropy] " * 3
    text = format_table([_result("fp32", 1000.0), _result(long_label.strip(), 123456.0), _result("fp16", None, "oom")])
    lines = text.splitlines()
    header, rule, first, second, failed, peaks = lines
    assert header.split() == ["#", "configuration", "tokens/s", "x", "first", "step", "ms", "spread", "MFU", "peak", "GiB",
                              "est", "GiB", "compile", "s", "loss", "status"]
    assert set(rule) == {"-"} and len(rule) >= max(len(line) for line in lines[2:5])
    assert long_label.strip() in second  # one line, rich markup left alone
    # Right-aligned: the tokens/s column ends where its header ends.
    end = header.index("tokens/s") + len("tokens/s")
    assert first[:end].endswith("1.0k") and second[:end].endswith("123.5k") and failed[:end].endswith("-")
    assert first.split()[-1] == "ok" and failed.split()[-1] == "oom"
    assert peaks == "MFU peaks: datasheet: test"
    assert text.isascii() and all(line == line.rstrip() for line in lines)


def test_columns_added_later_are_rendered_too():
    lines = render_columns(["a", "name", "spread %"], [["1", "x", "0.4"], ["22", "longer name", "-"]])
    assert lines[0] == " a  name         spread %"
    assert lines[3] == "22  longer name         -"

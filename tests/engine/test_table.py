"""The bench/tune table as text: aligned, plain ASCII, labels verbatim; unwrapped in a log, fitted
to the terminal's width on a terminal."""

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
    assert header.split() == ["#", "configuration", "tokens/s", "x", "first", "step", "ms", "spread", "MFU", "peak", "mem",
                              "est", "mem", "compile", "s", "loss", "status"]
    assert set(rule) == {"-"} and len(rule) >= max(len(line) for line in lines[2:5])
    assert long_label.strip() in second  # one line, rich markup left alone
    # Right-aligned: the tokens/s column ends where its header ends.
    end = header.index("tokens/s") + len("tokens/s")
    assert first[:end].endswith("1.0k") and second[:end].endswith("123.5k") and failed[:end].endswith("-")
    assert first.split()[-1] == "ok" and failed.split()[-1] == "oom"
    assert peaks == "MFU peaks: datasheet: test"
    assert "3 GiB" in first and "3 GiB" in second
    assert text.isascii() and all(line == line.rstrip() for line in lines)


def test_columns_added_later_are_rendered_too():
    lines = render_columns(["a", "name", "spread %"], [["1", "x", "0.4"], ["22", "longer name", "-"]])
    assert lines[0] == " a  name         spread %"
    assert lines[3] == "22  longer name         -"


def test_the_table_fits_a_narrow_terminal_label_wrapped_key_columns_kept():
    long_label = "bf16 + sdpa + compile(reduce-overhead) + fused AdamW + [linear_cross_entropy]"
    small = protocol.TrialResult(config={}, label="fp32", status="ok", tokens_per_s=900.0,
                                 step_ms=12.0, step_ms_q1=11.9, step_ms_q3=12.1,
                                 peak_memory_bytes=15 << 20, compile_s=1.5, loss_ok=True,
                                 loss_max_rel_error=1e-3)
    results = [small, _result(long_label, 123456.0), _result("fp16", None, "oom")]
    for width in (80, 100):
        lines = format_table(results, width=width).splitlines()
        assert all(len(line) <= width for line in lines if not line.startswith(("(", "MFU")))
        header = lines[0].split()
        for kept in ("#", "configuration", "tokens/s", "spread", "peak", "status"):
            assert kept in header
        assert lines[2].split()[-1] == "ok" and "15 MiB" in lines[2]  # MiB under 1 GiB
    # (est mem has no figure: left out without a word)
    assert "(not shown at 80 columns: MFU, compile s, loss;" in format_table(results, width=80)
    assert "".join(format_table(results, width=80).split()).count("linear_cross") == 1

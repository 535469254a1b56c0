"""A command line read as git reads one: options before the command apply to it or are refused
in one line; every command's help ends with three examples."""

import pytest

from tuner_tui import cli
from tuner_tui.cli import UsageError, build_parser, parse_args


def test_options_before_the_command_apply_to_it():
    args = parse_args(["--device", "cuda", "--workload", "llama-tiny", "bench", "--preset", "quick"])
    assert (args.command, args.device, args.workload, args.preset) == (
        "bench", "cuda", "llama-tiny", ["quick"])
    args = parse_args(["--seq-len", "32", "--seed", "3", "tune", "--data", "a.txt"])
    assert (args.seq_len, args.seed, args.data, args.max_memory) == (32, 3, "a.txt", None)
    args = parse_args(["--max-memory", "3GiB", "tune"])
    assert args.max_memory == "3GiB"
    args = parse_args(["--config", "a.toml", "bench", "--config", "b.toml"])
    assert args.config == ["a.toml", "b.toml"]
    args = parse_args(["--device", "cpu", "--config", "a.toml"])  # the dashboard
    assert (args.command, args.device, args.config, args.workload) == (None, "cpu", "a.toml", "auto")
    args = parse_args(["bench"])
    assert (args.device, args.workload, args.seed, args.data, args.seq_len) == (
        "auto", "auto", 0, None, None)
    # The same value on both sides says one thing.
    assert parse_args(["--device", "cpu", "bench", "--device", "cpu"]).device == "cpu"


@pytest.mark.parametrize("argv, words", [
    (["--device", "cuda", "bench", "--device", "cpu"],
     ["--device is given twice, cuda before bench and cpu after it"]),
    (["--max-memory", "1GiB", "tune", "--max-memory", "2GiB"], ["--max-memory is given twice"]),
    (["--max-memory", "1GiB", "bench"], ["--max-memory does not apply to bench"]),
    (["--config", "a.toml", "tune"], ["--config does not apply to tune", "--compare a.toml"]),
    (["--steps", "5", "bench"], ["--steps is an option of bench and tune", "gputune bench --steps"]),
    (["--budget-minutes=5", "tune"], ["--budget-minutes is an option of tune"]),
    (["--set", "precision=bf16"], ["--set is an option of bench and tune, not of the dashboard"]),
])
def test_what_does_not_apply_is_refused_in_one_line(argv, words, capsys):
    with pytest.raises(UsageError) as refused:
        parse_args(argv)
    for word in words:
        assert word in str(refused.value)
    assert cli.main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and words[0] in lines[0]


@pytest.mark.parametrize("command", [None, "bench", "tune"])
def test_every_help_ends_with_three_examples(command):
    parser = build_parser()
    text = (parser.commands[command] if command else parser).format_help().rstrip().splitlines()
    start = text.index("examples:")
    commands = [ln.strip() for ln in text[start + 1:] if ln.startswith("  gputune")]
    assert len(commands) == 3 and len(text) - start == 7  # each with a line that says what it does
    for example in commands:  # each one a command line that parses, for this command
        parsed = parse_args(example.split()[1:])
        assert command is None or parsed.command == command

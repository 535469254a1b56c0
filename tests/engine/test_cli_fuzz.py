"""Fuzzing the inputs that reach the command line before any worker: configuration files
(`bench --config`, `tune --compare`), `--set` values and the GPUTUNE_* variables. Each either is
refused with one line and exit code 2, or is accepted (and reaches the point where a
measurement would start); never a traceback. What is accepted is within every option's
declared range, so no worker is handed a value it overflows on."""

import json
import math
import signal

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies.options import IntOption
from strategies.registry import OPTIONS
from tuner_tui import cli
from tuner_tui.engine import bench, kernel_knobs, search


class Accepted(Exception):
    """The input passed validation: a measurement would start here."""


def _reach_measurement(*args, **kwargs):
    raise Accepted


def _bench_reached(plan, *args, **kwargs):
    for config in plan.configs:
        _within_declared_ranges(config.to_dict())
    raise Accepted


def _tune_reached(self, *args, **kwargs):
    for config in self.plan.compare:
        _within_declared_ranges(config.to_dict())
    _within_declared_ranges(self.plan.fixed)
    raise Accepted


def _within_declared_ranges(values: dict) -> None:
    for key, value in values.items():
        option = OPTIONS[key]
        if type(option) is IntOption:  # every integer option declares both ends
            assert option.minimum <= value <= option.maximum, (key, value)
        elif isinstance(option, IntOption):  # a float: finite, at least its minimum
            assert math.isfinite(value) and value >= option.minimum, (key, value)


keys = st.sampled_from(sorted(OPTIONS)) | st.text(max_size=12)
scalars = (
    st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from([c for o in OPTIONS.values() for c in getattr(o, "choices", ())] or ["fp32"])
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
documents = st.dictionaries(
    st.sampled_from(["config", "measured", "environment", "workload", "other"]),
    st.dictionaries(keys, values, max_size=4) | scalars, max_size=3,
)


def _run(args, capsys) -> None:
    # (the signal handlers cli.main installs: given back in conftest's fixture, once a test,
    # and by hand here, once an example)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = cli.main(args)
    except Accepted:
        code = None
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    if code is not None:
        lines = [ln for ln in captured.err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, (code, captured.err)


FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def no_measurement(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(bench, "run_bench", _bench_reached)
    monkeypatch.setattr(search.Search, "run", _tune_reached)
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path_factory.mktemp("home")))


commands = st.sampled_from([("bench", "--config"), ("tune", "--compare")])


@FUZZ
@given(doc=documents, as_json=st.booleans(), command=commands)
def test_config_files(tmp_path, capsys, doc, as_json, command):
    if as_json:
        path = tmp_path / "c.json"
        path.write_text(json.dumps(doc))
    else:
        path = tmp_path / "c.toml"
        try:
            path.write_text(tomli_w.dumps(doc))
        except (TypeError, ValueError):  # not representable in TOML: write it as raw text
            path.write_text(repr(doc))
    _run([command[0], "--device", "cpu", command[1], str(path)], capsys)


@FUZZ
@given(text=st.text(max_size=200), command=commands)
def test_config_files_of_any_text(tmp_path, capsys, text, command):
    path = tmp_path / "c.toml"
    path.write_text(text)
    _run([command[0], "--device", "cpu", command[1], str(path)], capsys)


@FUZZ
@given(items=st.lists(st.tuples(keys, st.text(max_size=30)
                                | st.integers(-(2**80), 2**80).map(str)
                                | st.floats().map(lambda f: repr(f) if not math.isnan(f) else "nan")),
                      max_size=4),
       raw=st.lists(st.text(max_size=20), max_size=2),
       command=st.sampled_from(["bench", "tune"]))
def test_set_values(capsys, items, raw, command):
    args = [command, "--device", "cpu"]
    for key, value in items:
        args += ["--set", f"{key}={value}"]
    for item in raw:
        args += ["--set", item]
    _run(args, capsys)


knob_values = (st.text(max_size=30) | st.integers(-(2**70), 2**70).map(str)
               | st.integers(1, 6000).map(lambda n: "9" * n))


@FUZZ
@given(env=st.dictionaries(st.sampled_from(["GPUTUNE_PARTIAL_SUMS", "GPUTUNE_LCE_CHUNK_ROWS",
                                            "GPUTUNE_FAST_LAUNCH", "GPUTUNE_NATIVE",
                                            kernel_knobs.OPTIMIZER_WARMUP_ENV,
                                            kernel_knobs.WORKLOAD_TIMEOUT_ENV]),
                           knob_values, max_size=3))
def test_gputune_variables(capsys, env):
    env = {k: v for k, v in env.items() if "\x00" not in v}
    problems = kernel_knobs.problems(env)
    assert all(len(line) < 400 for line in problems)
    if not problems:
        rows = env.get("GPUTUNE_LCE_CHUNK_ROWS", "").strip()
        assert not rows or 1 <= int(rows) <= kernel_knobs.MAX_CHUNK_ROWS
        assert 0 < kernel_knobs.workload_timeout_s(env) <= 86400

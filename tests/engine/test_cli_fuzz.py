"""Fuzzing the inputs that reach the command line before any worker: configuration files and
`--set` values. Each either is refused with one line and exit code 2, or is accepted (and
reaches the point where a measurement would start); never a traceback."""

import json
import math
import signal

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies.registry import OPTIONS
from tuner_tui import cli
from tuner_tui.engine import bench


class Accepted(Exception):
    """The input passed validation: a measurement would start here."""


def _reach_measurement(*args, **kwargs):
    raise Accepted


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
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
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
    monkeypatch.setattr(bench, "run_bench", _reach_measurement)
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path_factory.mktemp("home")))


@FUZZ
@given(doc=documents, as_json=st.booleans())
def test_config_files(tmp_path, capsys, doc, as_json):
    if as_json:
        path = tmp_path / "c.json"
        path.write_text(json.dumps(doc))
    else:
        path = tmp_path / "c.toml"
        try:
            path.write_text(tomli_w.dumps(doc))
        except (TypeError, ValueError):  # not representable in TOML: write it as raw text
            path.write_text(repr(doc))
    _run(["bench", "--device", "cpu", "--config", str(path)], capsys)


@FUZZ
@given(text=st.text(max_size=200))
def test_config_files_of_any_text(tmp_path, capsys, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    _run(["bench", "--device", "cpu", "--config", str(path)], capsys)


@FUZZ
@given(items=st.lists(st.tuples(keys, st.text(max_size=30)
                                | st.integers(-(2**80), 2**80).map(str)
                                | st.floats().map(lambda f: repr(f) if not math.isnan(f) else "nan")),
                      max_size=4),
       raw=st.lists(st.text(max_size=20), max_size=2))
def test_set_values(capsys, items, raw):
    args = ["bench", "--device", "cpu"]
    for key, value in items:
        args += ["--set", f"{key}={value}"]
    for item in raw:
        args += ["--set", item]
    _run(args, capsys)

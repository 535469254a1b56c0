import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import ConfigError, ExportedConfig, TuneConfig, load, read, save
from strategies.registry import OPTIONS, Capabilities

CPU = Capabilities(device="cpu", cuda=False, bf16=True, triton=False,
                   reasons={"cuda": "device = cpu was chosen"})
OLD_GPU = Capabilities(device="cuda", cuda=True, bf16=False, triton=True, gpu_name="Tesla V100",
                       reasons={"bf16": "compute capability < 8.0"})


def test_defaults_are_the_fp32_eager_baseline():
    c = TuneConfig()
    assert (c.precision, c.compile_mode, c.attention, c.checkpointing, c.optimizer) == (
        "fp32", "off", "manual", "off", "plain")
    assert c.changed() == {}


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_export_round_trips_config_measurements_and_environment(tmp_path, fmt):
    c = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "max-autotune",
                              "fused_kernels": ["gelu", "layer_norm"], "batch_size": 32})
    exported = ExportedConfig(c, {"tokens_per_s": 491000.5, "mfu": 0.41}, {"gpu_name": "NVIDIA H200",
                              "torch": "2.11.0", "cuda": None}, workload="gpt2-124m")
    path = save(exported, tmp_path / f"x.{fmt}")
    back = read(path)
    assert back.config == c and back.workload == "gpt2-124m"
    assert back.measured == {"tokens_per_s": 491000.5, "mfu": 0.41}
    assert back.environment == {"gpu_name": "NVIDIA H200", "torch": "2.11.0"}  # None dropped
    assert load(path).fused_kernels == ("layer_norm", "gelu")  # canonical registry order


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "gputune.toml"
    path.write_text("old contents")
    save(TuneConfig(), path)
    assert load(path) == TuneConfig()
    # no temporary file left; the file replaced is kept beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gputune.toml", "gputune.toml.1"]
    assert (tmp_path / "gputune.toml.1").read_text() == "old contents"


def test_save_to_unwritable_place_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot write"):
        save(TuneConfig(), tmp_path / "no" / "such" / "dir" / "x.toml")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"precison": "bf16"}, "unknown option 'precison': allowed options are precision"),
        ({"precision": "fp8"}, "precision = 'fp8' is not allowed: one of fp32, tf32, bf16, fp16"),
        ({"compile_fullgraph": "yes"}, "wrong type: true or false"),
        ({"batch_size": -4}, "batch_size = -4 is out of range: an integer >= 0"),
        ({"batch_size": 2.5}, "wrong type: an integer >= 0"),
        ({"fused_kernels": ["flash"]}, "contains 'flash', which is not allowed: a list drawn from"),
        ({"fused_kernels": "gelu"}, "wrong type"),
        ({"grad_clip": float("nan")}, "out of range"),
        ({"compile_fullgraph": True}, "compile_fullgraph = true needs compile_mode other than off"),
    ],
)
def test_bad_values_name_the_option_and_the_allowed_values(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TuneConfig.from_dict(data)


@pytest.mark.parametrize(
    "data, caps, words",
    [
        ({"precision": "fp16"}, CPU, ["precision = fp16", "a CUDA GPU", "device = cpu"]),
        ({"compile_mode": "reduce-overhead"}, CPU, ["compile_mode = reduce-overhead", "device = cpu"]),
        ({"fused_kernels": ["gelu"]}, CPU, ["fused_kernels = [gelu]", "Triton", "device = cpu"]),
        ({"precision": "bf16"}, OLD_GPU, ["precision = bf16", "bfloat16", "compute capability"]),
    ],
)
def test_options_the_machine_cannot_run_are_refused_naming_option_and_device(data, caps, words):
    config = TuneConfig.from_dict(data)
    with pytest.raises(ConfigError) as info:
        config.check_runnable(caps)
    for word in words:
        assert word in str(info.value)


def test_runnable_configurations_pass_the_check():
    TuneConfig.from_dict({"precision": "bf16", "compile_mode": "default"}).check_runnable(CPU)
    TuneConfig.from_dict({"precision": "fp16", "compile_mode": "reduce-overhead"}).check_runnable(
        Capabilities(device="cuda", cuda=True, bf16=True, triton=True))


@pytest.mark.parametrize(
    "text, message",
    [
        ("[config]\nprecision = \n", "is not valid TOML"),
        ("precision = 'bf16'\n", "unknown section 'precision'"),
        ("[measured]\nx = 1\n", "has no [config] section"),
        ("[config]\nbatch_size = 'big'\n", "batch_size = 'big' has the wrong type"),
    ],
)
def test_bad_files_give_one_line_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="allowed formats are toml, json"):
        load(tmp_path / "x.yaml")


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=True),
    st.text(max_size=12), st.lists(st.text(max_size=8), max_size=3),
    st.sampled_from(["fp16", "bf16", "default", "full", "gelu", "sdpa", "fused"]),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(OPTIONS) + ["bogus", "Precision"]), _values, max_size=6))
def test_fuzzed_configurations_either_load_or_raise_config_error(data):
    try:
        config = TuneConfig.from_dict(data)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert TuneConfig.from_dict(config.to_dict()) == config


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_file_bytes_never_escape_as_anything_but_config_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "f.json"
    path.write_bytes(raw)
    try:
        load(path)
    except ConfigError:
        pass
    path = path.with_suffix(".toml")
    path.write_bytes(raw)
    try:
        load(path)
    except ConfigError:
        pass


def test_json_document_layout(tmp_path):
    save(TuneConfig.from_dict({"optimizer": "fused"}), tmp_path / "c.json")
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["config"]["optimizer"] == "fused"


def test_the_typed_options_of_tuneconfig_are_the_registrys():
    """TuneConfig declares each option for type checkers (under TYPE_CHECKING): the same keys,
    in the registry's order, with the kind's type and, for a choice, exactly its choices."""
    import ast
    import inspect

    from strategies import config
    from strategies.registry import (
        OPTIONS, BoolOption, ChoiceOption, FloatOption, IntOption, SetOption,
    )

    tree = ast.parse(inspect.getsource(config.TuneConfig))
    block = next(n for n in ast.walk(tree)
                 if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    declared = {n.target.id: n.annotation for n in block.body if isinstance(n, ast.AnnAssign)}
    assert list(declared) == list(OPTIONS)
    for key, option in OPTIONS.items():
        note = declared[key]
        if isinstance(option, ChoiceOption):
            assert ast.unparse(note.value) == "Literal", key
            values = note.slice.elts if isinstance(note.slice, ast.Tuple) else [note.slice]
            assert tuple(ast.literal_eval(v) for v in values) == option.choices, key
        else:
            want = {BoolOption: "bool", FloatOption: "float", IntOption: "int",
                    SetOption: "tuple[str, ...]"}[type(option)]
            assert ast.unparse(note) == want, key


def test_a_batch_that_the_devices_cannot_share_evenly_is_refused_with_the_sizes_that_work():
    import pytest

    from strategies.config import ConfigError, TuneConfig

    config = TuneConfig.from_dict({"parallel": "ddp", "devices": 3})
    with pytest.raises(ConfigError, match="batch_size = 8 is not a multiple of devices = 3"):
        config.accumulation_steps(8)
    assert config.accumulation_steps(6) == 1


def test_differing_names_the_options_that_differ_in_the_registrys_order():
    """The search compares configurations hundreds of thousands of times by their held values:
    the same answer as comparing each option by name, lists and tuples alike."""
    a = TuneConfig.from_dict({"precision": "bf16", "fused_kernels": ["rms_norm", "gelu"]})
    b = a.replace(fused_kernels=("rms_norm", "gelu"), compile_mode="default", weights="bf16")
    by_name = tuple(k for k in OPTIONS if a.to_dict()[k] != b.to_dict()[k])
    assert a.differing(b) == by_name == tuple(k for k in OPTIONS if k in (
        "weights", "compile_mode"))
    assert a.differing(a.replace(fused_kernels=["rms_norm", "gelu"])) == ()
    assert b.differing(a) == a.differing(b)

"""Bad input: one line naming the problem and the allowed values, exit code 2, no traceback."""

import os

import pytest

TINY_8 = "tests.engine.user_workloads:tiny_mlp_batch_8"
"""A model as small as can be, at gpt2-tiny's default batch (8), for the refusals that come once
the worker has loaded the workload: its worker is up in half the time gpt2-tiny's takes."""


def _check_user_error(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["bench", "--device", "tpu"], ["unknown device 'tpu'", "cuda, cpu, auto"]),
        (["bench", "--workload", "gpt5"], ["unknown workload 'gpt5'", "gpt2-tiny", "module:function"]),
        (["bench", "--workload", "no_such_module_x:build"], ["no module named 'no_such_module_x'"]),
        (["bench", "--data", "/no/such/file.txt"], ["--data file /no/such/file.txt does not exist"]),
        (["bench", "--set", "batch_size=-3"], ["batch_size = -3 is out of range", ">= 0"]),
        (["bench", "--set", "precision=fp8"], ["precision = 'fp8'", "fp32, tf32, bf16, fp16"]),
        (["bench", "--set", "colour=red"], ["unknown option 'colour'", "precision"]),
        (["bench", "--set", "compile_fullgraph=maybe"], ["compile_fullgraph", "true or false"]),
        (["bench", "--preset", "fastest"], ["unknown preset 'fastest'", "ladder"]),
        (["bench", "--steps", "0"], ["--steps 0 is out of range"]),
        (["tune", "--remeasure", "x"], ["--remeasure: 'x' is not allowed: a whole number"]),
        (["tune", "--budget-minutes", "soon"], ["'soon' is not allowed: a number"]),
        (["bench", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["--config", "/no/such.toml", "--device", "cpu"], ["/no/such.toml does not exist"]),
    ],
)
def test_bad_command_lines(gputune, args, words):
    _check_user_error(gputune(*args), *words)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[config]\nprecision = 'fp8'\n", ["precision = 'fp8' is not allowed", "fp32, tf32"]),
        ("[config]\nprecison = 'bf16'\n", ["unknown option 'precison'", "allowed options are"]),
        ("[config]\nbatch_size = -1\n", ["batch_size = -1 is out of range"]),
        ("[config]\nbatch_size = 'x'\n", ["batch_size = 'x' has the wrong type"]),
        ("[config\n", ["is not valid TOML"]),
    ],
)
def test_bad_config_files(gputune, tmp_path, text, words):
    path = tmp_path / "c.toml"
    path.write_text(text)
    _check_user_error(gputune("bench", "--device", "cpu", "--config", str(path)), str(path), *words)


def test_config_the_cpu_cannot_run_is_refused_before_any_run(gputune, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[config]\nprecision = 'fp16'\n")
    proc = gputune("bench", "--device", "cpu", "--workload", TINY_8, "--config", str(path))
    _check_user_error(proc, "precision = fp16 needs a CUDA GPU", "device = cpu")
    assert "measuring" not in proc.stdout


@pytest.mark.parametrize(
    "workload, words",
    [
        ("user_workloads:missing", ["has no function 'missing'", "its functions: ", "tiny_mlp,"]),
        ("user_workloads:not_a_workload", ["returned dict", "expected", "Workload"]),
        ("user_workloads:raises", ["raised RuntimeError: dataset server unreachable"]),
    ],
)
def test_broken_user_workloads(gputune, workload, words):
    _check_user_error(
        gputune("bench", "--device", "cpu", "--workload", f"tests.engine.{workload}"), *words)


def test_data_file_too_short(gputune, tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("hi")
    _check_user_error(
        gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--data", str(path)),
        "holds 2 bytes")


def test_help_and_version(gputune):
    assert gputune("--version").stdout.startswith("gputune ")
    out = gputune("bench", "--help").stdout
    for flag in ("--workload", "--device", "--steps", "--config", "--preset", "--json", "--export"):
        assert flag in out


def test_sigterm_during_bench_leaves_no_worker_behind(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from pathlib import Path

    import psutil

    ROOT = Path(__file__).resolve().parents[2]

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "pythonpath")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner_tui.cli", "bench", "--device", "cpu", "--workload",
         "gpt2-tiny", "--steps", "500", "--warmup", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    children = []
    while time.monotonic() < deadline and not children:
        children = parent.children(recursive=True)
        time.sleep(0.2)
    assert children, "the bench started no worker"
    time.sleep(3)  # let the worker get into its training loop
    children = parent.children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    assert proc.returncode == 130


# -- refused before any worker starts: run in this process, which imports no torch for them ----


@pytest.fixture
def cli(monkeypatch, capsys, tmp_path_factory):
    """`tuner_tui.cli.main` in this process: (exit code, stderr lines). Reaching a measurement
    is a failure of these tests: every input here must be refused before one."""
    from tuner_tui import cli as cli_module
    from tuner_tui.engine import bench, search

    def no_measurement(*args, **kwargs):
        raise AssertionError("a measurement started")

    monkeypatch.setattr(bench, "run_bench", no_measurement)
    monkeypatch.setattr(search.Search, "run", no_measurement)
    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path_factory.mktemp("home")))
    def run(*args):
        code = cli_module.main(list(args))  # (its signal handlers: conftest gives them back)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err + captured.out
        return code, [ln for ln in captured.err.splitlines() if ln.strip()]

    return run


def _refused(result, *words):
    code, lines = result
    assert code == 2 and len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["bench", "--set", "batch_size=100000000000000000000000"],
         ["batch_size = 100000000000000000000000 is out of range", "<= 1048576"]),
        (["bench", "--set", "batch_size=1e23"], ["batch_size = '1e23' has the wrong type"]),
        (["bench", "--trial-timeout", "0"], ["--trial-timeout 0 is out of range", "> 0"]),
        (["bench", "--trial-timeout", "-5"], ["--trial-timeout -5 is out of range"]),
        (["bench", "--trial-timeout", "nan"], ["--trial-timeout nan is out of range"]),
        (["tune", "--trial-timeout", "nan"], ["--trial-timeout nan is out of range"]),
        (["tune", "--budget-minutes", "nan"], ["--budget-minutes nan is out of range"]),
        (["tune", "--budget-minutes", "-0.5"], ["--budget-minutes -0.5 is out of range"]),
        (["bench", "--seed", "-1"], ["--seed -1 is out of range", "0 to 4294967295"]),
        (["tune", "--seed", "18446744073709551616"], ["--seed 18446744073709551616 is out"]),
        (["bench", "--seq-len", "99999999999"], ["--seq-len 99999999999 is out of range"]),
        (["tune", "--search", "batch_size=x0"], ["--search batch_size=x0 is out of range"]),
        (["tune", "--search", "batch_size=x1,x-2"], ["batch_size=x-2 is out of range"]),
        (["tune", "--max-memory", "9" * 400], ["--max-memory", "is not a size"]),
        (["bench", "--json", "/no/such/folder/r.json"], ["--json /no/such/folder/r.json",
                                                          "its folder does not exist"]),
        (["bench", "--json", "/proc/r.json"], ["--json /proc/r.json: cannot write in folder /proc"]),
        (["bench", "--export", "/no/such/g.toml"], ["--export", "does not exist"]),
        (["bench", "--export", "g.yaml"], ["--export", "unknown file format 'yaml'"]),
        (["tune", "--out", "/proc/g.toml"], ["--out /proc/g.toml: cannot write in folder /proc"]),
        (["tune", "--json", "/no/such/t.json"], ["--json /no/such/t.json", "does not exist"]),
        (["bench", "--json", "/dev/null"], ["--json /dev/null is a character device"]),
        (["tune", "--out", "/dev/null"], ["--out /dev/null is a character device"]),
        (["tune", "--max-memory", "1" + "0" * 309 + "B"], ["--max-memory", "(311 characters)",
                                                          "a size from 1 B to 1 EiB"]),
        (["--max-memory", "1" + "0" * 309 + "B"], ["--max-memory", "a size from 1 B to 1 EiB"]),
        (["tune", "--max-memory", "2EiB"], ["--max-memory '2EiB' is not a size from 1 B"]),
        (["bench", "--set", "parallel=ddp", "--set", "ddp_bucket_mb=99999999999999999999"],
         ["ddp_bucket_mb = 99999999999999999999 is out of range", "<= 1048576"]),
        (["tune", "--set", "checkpoint_every=" + "1" + "0" * 30], ["checkpoint_every", "<= 1024"]),
        (["bench", "--set", "micro_batch_size=" + "9" * 30], ["micro_batch_size", "<= 1048576"]),
        (["bench", "--set", "devices=100000"], ["devices = 100000 is out of range", "<= 1024"]),
        (["bench", "--format", "hf"], ["--format needs --export FILE"]),
        (["tune", "--format", "hf,yaml"], ["--format 'yaml' is not a trainer format",
                                           "hf, accelerate, lightning"]),
    ],
)
def test_bad_numbers_and_paths_are_refused_up_front(cli, args, words):
    _refused(cli(*args, "--device", "cpu"), *words)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag", ["bench --config", "tune --compare", "--config", "bench --data",
                                  "tune --data"])
def test_a_file_input_that_is_a_pipe_a_device_or_a_folder_is_one_line_never_a_hang(
        cli, tmp_path, monkeypatch, flag):
    from tuner_tui import app

    monkeypatch.setattr(app, "run_dashboard", lambda *a: pytest.fail("the dashboard opened"))
    fifo = tmp_path / "in.toml"
    os.mkfifo(fifo)  # no writer: a plain open() would wait for one forever
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " * (1 << 20))
    noun = "--data file" if "data" in flag else "configuration file"
    cases = [(fifo, "is a named pipe (fifo), not a regular file"),
             ("/dev/zero", "is a character device, not a regular file"),
             (tmp_path, "is a folder, not a regular file")]
    if "data" not in flag:
        cases.append((big, "holds 2097152 bytes, more than the 1048576 allowed"))
    for path, words in cases:
        _refused(cli(*flag.split(), str(path), "--device", "cpu"), f"{noun} {path} {words}")


def test_a_folder_given_as_an_output_file_is_refused(cli, tmp_path):
    _refused(cli("bench", "--device", "cpu", "--json", str(tmp_path)), "is a folder")
    _refused(cli("tune", "--device", "cpu", "--out", str(tmp_path)), "is a folder")


def test_a_config_nested_500_deep_is_one_line(cli, tmp_path):
    for name, text in [
        ("deep.toml", "[config]\nfused_kernels = " + "[" * 500 + "]" * 500 + "\n"),
        ("deep2.toml", "[config]\nx = " + "{a=" * 500 + "1" + "}" * 500 + "\n"),
        ("deep.json", '{"config": {"fused_kernels": ' + "[" * 500 + "]" * 500 + "}}"),
        ("big.json", '{"config": {"batch_size": ' + "9" * 5000 + "}}"),
        ("big.toml", "[config]\ngrad_clip = 1e999\n"),
    ]:
        path = tmp_path / name
        path.write_text(text)
        _refused(cli("bench", "--device", "cpu", "--config", str(path)), str(path))


def test_the_current_folder_is_searched_last_and_only_for_a_module_function(
    tmp_path, monkeypatch
):
    import argparse
    import importlib.util
    import sys

    from tuner_tui import cli as cli_module

    (tmp_path / "tomli_w.py").write_text("raise SystemExit('the stray tomli_w ran')\n")
    (tmp_path / "my_workload.py").write_text("def build():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    args = argparse.Namespace(device="cpu", data=None, seq_len=None, seed=0, workload="gpt2-tiny")
    cli_module.check_run_options(args)
    assert str(tmp_path) not in sys.path
    args.workload = "my_workload:build"
    cli_module.check_run_options(args)
    assert sys.path[-1] == str(tmp_path)
    assert importlib.util.find_spec("tomli_w").origin != str(tmp_path / "tomli_w.py")


def test_a_package_is_not_imported_to_check_a_workload(cli, tmp_path, monkeypatch):
    import sys

    package = tmp_path / "noisy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('package init ran')\n")
    (package / "sub.py").write_text("def build():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from tuner_tui.engine.paths import module_exists

    assert module_exists("noisy_pkg.sub") and not module_exists("noisy_pkg.nope")
    assert "noisy_pkg" not in sys.modules


# -- refused by the worker as it starts: real commands ----------------------------------------


@pytest.mark.parametrize("init, words", [
    ("raise RuntimeError('broken package')\n", ["cannot import 'badpkg.sub'", "RuntimeError: broken package"]),
    ("raise KeyboardInterrupt\n", ["cannot import 'badpkg.sub'", "KeyboardInterrupt"]),
])
def test_a_workload_package_that_fails_on_import(gputune, tmp_path, init, words):
    package = tmp_path / "badpkg"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    (package / "sub.py").write_text("def build():\n    pass\n")
    proc = gputune("bench", "--device", "cpu", "--workload", "badpkg.sub:build", cwd=tmp_path)
    _check_user_error(proc, "workload 'badpkg.sub:build'", *words)


def test_every_configuration_skipped_is_one_line(gputune):
    proc = gputune("bench", "--device", "cpu", "--workload", TINY_8, "--set", "precision=fp16")
    _check_user_error(proc, "no configuration can run on device = cpu", "precision = fp16 needs a CUDA GPU")
    assert "skipped" not in proc.stdout and "measuring" not in proc.stdout


def test_dashboard_on_cuda_without_a_gpu_exits_before_it_opens(gputune):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    _check_user_error(gputune("--device", "cuda", timeout=180), "--device cuda: torch sees no CUDA GPU")


def test_the_report_header_leaves_out_what_is_not_known():
    from tuner_tui.cli import describe_run

    mlp = {"name": "mlp", "items_per_sample": 1, "item_name": "samples", "default_batch_size": 64}
    line = describe_run(mlp, {"torch": "2.13.0", "triton": None, "driver": None})
    assert line == "mlp on CPU, default batch 64, torch 2.13.0"
    gpt = {"name": "gpt2-124m", "items_per_sample": 1024, "item_name": "tokens",
           "default_batch_size": 16}
    env = {"gpu_name": "NVIDIA H200", "torch": "2.13.0", "driver": "570.1", "cuda": "12.8"}
    assert describe_run(gpt, env) == ("gpt2-124m on NVIDIA H200, 1024 tokens per sample, default "
                                      "batch 16, torch 2.13.0, cuda 12.8, driver 570.1")


@pytest.mark.parametrize(
    "args, words",
    [
        (["bench", "--set", "micro_batch_size=3"],
         # The preset ladder: the cause named is the batch, not the device.
         ["no configuration can run with this batch", "micro_batch_size = 3 does not divide "
          "batch_size = 8", "1, 2, 4, 8"]),
        (["bench", "--config", "{ddp3}"],
         ["batch_size = 8 is not a multiple of devices = 3", "a batch_size of 6"]),
        (["tune", "--set", "parallel=ddp", "--set", "devices=3", "--budget-minutes", "1"],
         ["batch_size = 8 is not a multiple of devices = 3"]),
    ],
)
def test_a_default_batch_that_does_not_divide_is_refused_before_any_run(gputune, tmp_path,
                                                                         args, words):
    """With batch_size = 0 the batch is the workload's default, known once the worker has loaded
    it: the check comes then, still before any measurement."""
    ddp3 = tmp_path / "ddp3.toml"
    ddp3.write_text("[config]\nparallel = 'ddp'\ndevices = 3\n")
    args = [a.replace("{ddp3}", str(ddp3)) for a in args]
    proc = gputune(*args, "--device", "cpu", "--workload", TINY_8)
    _check_user_error(proc, *words)
    assert "measuring" not in proc.stdout


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("GPUTUNE_PARTIAL_SUMS", "torhc", ["GPUTUNE_PARTIAL_SUMS is 'torhc'", "kernel, torch"]),
        ("GPUTUNE_LCE_CHUNK_ROWS", "-4", ["GPUTUNE_LCE_CHUNK_ROWS is '-4'", "a positive integer"]),
        ("GPUTUNE_LCE_CHUNK_ROWS", "1" * 5000, ["(5000 characters)", "up to 2147483648"]),
        ("GPUTUNE_LCE_CHUNK_ROWS", "\u00b2", ["GPUTUNE_LCE_CHUNK_ROWS is '\u00b2'"]),
        ("GPUTUNE_WORKLOAD_TIMEOUT", "inf", ["GPUTUNE_WORKLOAD_TIMEOUT is 'inf'", "up to 86400"]),
        ("GPUTUNE_FAST_LAUNCH", "no", ["GPUTUNE_FAST_LAUNCH is 'no'", "1", "0"]),
        ("GPUTUNE_NATIVE", "of", ["GPUTUNE_NATIVE is 'of'", "1", "0"]),
        ("GPUTUNE_OPTIMIZER_WARMUP", "off", ["GPUTUNE_OPTIMIZER_WARMUP is 'off'", "1", "0"]),
    ],
)
def test_a_bad_kernel_environment_variable_is_refused_up_front(cli, monkeypatch, name, value, words):
    # The kernels read these in the worker; a typo must not become a failed trial there.
    monkeypatch.setenv(name, value)
    _refused(cli("bench", "--device", "cpu"), *words)
    _refused(cli("tune", "--device", "cpu"), *words)

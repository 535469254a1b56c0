"""Bad input: one line naming the problem and the allowed values, exit code 2, no traceback."""

import pytest


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
    proc = gputune("bench", "--device", "cpu", "--workload", "gpt2-tiny", "--config", str(path))
    _check_user_error(proc, "precision = fp16 needs a CUDA GPU", "device = cpu")
    assert "measuring" not in proc.stdout


@pytest.mark.parametrize(
    "workload, words",
    [
        ("user_workloads:missing", ["has no function 'missing'"]),
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

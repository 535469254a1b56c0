"""Telemetry sampler: NVML through a fake module (no GPU here), psutil for real."""

from __future__ import annotations

import os
import subprocess
import sys
import types


from tuner_tui.engine.telemetry import TelemetrySampler, visible_gpu_filter


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def fake_nvml(count: int = 2, gpm: bool = True, power: bool = True, init_error: Exception | None = None):
    """A module with the pynvml functions the sampler calls; GPU i reports figures derived from i."""
    m = types.SimpleNamespace()
    m.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    m.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    m.NVML_GPM_METRICS_GET_VERSION = 1
    m.NVML_GPM_METRIC_SM_UTIL = 2
    m.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    m.calls = []
    m.freed = []

    def init():
        if init_error is not None:
            raise init_error

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: f"Fake GPU {h[1]}".encode()
    m.nvmlDeviceGetUUID = lambda h: f"GPU-0000{h[1]}-abcd"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50 + h[1], memory=10)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h[1] + 1) << 30, total=80 << 30, free=0)

    def power_usage(h):
        if not power:
            raise NVMLError_NotSupported("Not Supported")
        return 300_000

    m.nvmlDeviceGetPowerUsage = power_usage
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    m.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h[1]
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1755
    m.nvmlDeviceGetMaxClockInfo = lambda h, clock: 1980
    m.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1 if gpm else 0)
    samples = iter(range(1000))
    m.nvmlGpmSampleAlloc = lambda: ("sample", next(samples))
    m.nvmlGpmSampleGet = lambda h, s: None
    m.nvmlGpmSampleFree = lambda s: m.freed.append(s)

    class Metric:
        def __init__(self):
            self.metricId = 0
            self.nvmlReturn = 0
            self.value = 0.0

    class MetricsGet:
        def __init__(self):
            self.metrics = [Metric() for _ in range(4)]

    m.c_nvmlGpmMetricsGet_t = MetricsGet

    def metrics_get(request):
        for metric in request.metrics[: request.numMetrics]:
            metric.value = {2: 71.0, 5: 33.0}[metric.metricId]

    m.nvmlGpmMetricsGet = metrics_get
    return m


def test_every_gpu_reports_its_figures_and_gpm_after_two_samples():
    nvml = fake_nvml()
    sampler = TelemetrySampler(nvml=nvml, visible=None)
    first = sampler.sample(os.getpid())
    assert [g.name for g in first.gpus] == ["Fake GPU 0", "Fake GPU 1"]
    g1 = first.gpus[1]
    assert g1.utilization_pct == 51 and g1.memory_used_bytes == 2 << 30 and g1.memory_total_bytes == 80 << 30
    assert g1.power_w == 300 and g1.power_limit_w == 700 and g1.temperature_c == 61
    assert g1.sm_clock_mhz == 1755 and g1.sm_clock_max_mhz == 1980
    assert g1.sm_activity_pct is None  # GPM needs two samples
    second = sampler.sample(os.getpid())
    assert second.gpus[0].sm_activity_pct == 71.0 and second.gpus[0].tensor_activity_pct == 33.0
    assert nvml.freed  # the older GPM sample is released
    assert second.gpu_unavailable is None
    sampler.close()
    assert "shutdown" in nvml.calls


def test_unsupported_fields_are_none_and_gpm_says_why():
    sampler = TelemetrySampler(nvml=fake_nvml(count=1, gpm=False, power=False), visible=None)
    gpu = sampler.sample().gpus[0]
    assert gpu.power_w is None and gpu.utilization_pct == 50
    assert gpu.sm_activity_pct is None and "not supported" in gpu.gpm_note


def test_without_nvml_the_reason_is_one_clear_line():
    sampler = TelemetrySampler(nvml=fake_nvml(init_error=NVMLError_LibraryNotFound()), visible=None)
    sample = sampler.sample(os.getpid())
    assert sample.gpus == ()
    assert sample.gpu_unavailable == "NVML not available: library not found (no NVIDIA driver)"
    assert sample.host is not None and sample.process is not None


def test_real_nvml_here_gives_a_sample_or_a_reason():
    sampler = TelemetrySampler()
    sample = sampler.sample(os.getpid())
    assert sample.gpus or sample.gpu_unavailable
    sampler.close()


def test_cuda_visible_devices_selects_gpus_by_index_or_uuid():
    assert visible_gpu_filter(None) is None
    assert visible_gpu_filter("1, 0") == ["1", "0"]
    sampler = TelemetrySampler(nvml=fake_nvml(count=3), visible="2")
    assert [g.index for g in sampler.sample().gpus] == [2]
    sampler = TelemetrySampler(nvml=fake_nvml(count=3), visible="GPU-00001")
    assert [g.index for g in sampler.sample().gpus] == [1]
    sampler = TelemetrySampler(nvml=fake_nvml(count=3), visible="")
    sample = sampler.sample()
    assert sample.gpus == () and "CUDA_VISIBLE_DEVICES" in sample.gpu_unavailable


def test_worker_process_cpu_and_memory_include_its_children():
    # A parent that sleeps and a child that burns CPU and holds 30 MiB, like a worker and its
    # compile workers.
    busy = "x = bytearray(30 << 20)\nwhile True: sum(range(10000))"
    parent_code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {busy!r}])\n"
        "try:\n    time.sleep(30)\nfinally:\n    child.kill()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    import time

    import psutil

    try:
        sampler = TelemetrySampler(nvml=fake_nvml(count=0), visible=None)
        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        sampler.sample(parent.pid)
        time.sleep(0.6)
        sample = sampler.sample(parent.pid)
        assert sample.process.pid == parent.pid and sample.process.children == 1
        assert sample.process.cpu_percent > 20
        assert sample.process.rss_bytes > 30 << 20
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
    gone = sampler.sample(parent.pid)
    assert gone.process is None and "exited" in gone.process_note


def test_no_worker_yet():
    sample = TelemetrySampler(nvml=fake_nvml(count=0), visible=None).sample(None)
    assert sample.process is None and sample.process_note == "no worker process"
    assert "no NVIDIA GPU" in sample.gpu_unavailable


def test_telemetry_imports_no_torch():
    code = "import sys, tuner_tui.engine.telemetry; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

"""GPU and host telemetry: NVML for every visible GPU, psutil for the worker process and the host.

Torch-free, and sampled in the UI process (a thread of the dashboard) rather than in the worker, so
that the figures keep coming while the worker compiles, stalls or dies. Every NVML query is asked
on its own: a GPU that does not support one field (power on some boards, GPM before Hopper) still
reports the others. Without NVML the sample carries `gpu_unavailable`, a one-line reason.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. A field is None where the GPU or driver does not report it."""

    index: int
    name: str
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    sm_activity_pct: float | None = None
    """GPM: share of SMs busy (Hopper and later)."""
    tensor_activity_pct: float | None = None
    """GPM: share of time the SMs ran any tensor-core instruction (Hopper and later)."""
    gpm_note: str = ""
    """Why the GPM figures are missing, if they are."""


@dataclass(frozen=True)
class ProcessSample:
    """The worker process together with its children (torch.compile's compile workers)."""

    pid: int
    cpu_percent: float
    """Summed over the process and its children; 100 is one core fully used."""
    rss_bytes: int
    threads: int
    children: int


@dataclass(frozen=True)
class HostSample:
    cpu_percent: float
    """Whole machine, 0-100."""
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class TelemetrySample:
    wall_time: float
    gpus: tuple[GpuSample, ...] = ()
    gpu_unavailable: str | None = None
    """Why `gpus` is empty, e.g. "NVML not available: library not found (no NVIDIA driver)"."""
    host: HostSample | None = None
    process: ProcessSample | None = None
    process_note: str = ""
    """Why `process` is None (no worker yet, worker exited)."""


def _nvml_reason(nvml: Any, exc: BaseException) -> str:
    """A one-line reason for a failed nvmlInit, in the user's words."""
    library_missing = getattr(nvml, "NVMLError_LibraryNotFound", None)
    driver_missing = getattr(nvml, "NVMLError_DriverNotLoaded", None)
    if library_missing is not None and isinstance(exc, library_missing):
        return "NVML not available: library not found (no NVIDIA driver)"
    if driver_missing is not None and isinstance(exc, driver_missing):
        return "NVML not available: the NVIDIA driver is not loaded"
    return f"NVML not available: {exc}"


def visible_gpu_filter(env: str | None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES (indices or UUID prefixes), or None for all GPUs.
    NVML ignores that variable, so the sampler applies it to show the GPUs the worker can use."""
    if env is None:
        return None
    return [part.strip() for part in env.split(",") if part.strip()]


class TelemetrySampler:
    """Call `sample(pid)` from one thread, a few times a second; `close()` at the end.

    `nvml` and `psutil_module` are injectable for tests (a fake module with the same functions)."""

    GPM_METRICS = ("sm", "tensor")

    def __init__(self, nvml: Any = None, psutil_module: Any = None, visible: str | None = ...) -> None:
        if psutil_module is None:
            import psutil as psutil_module
        self._psutil = psutil_module
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] = []
        self._names: dict[int, str] = {}
        self._gpm_previous: dict[int, Any] = {}
        self._gpm_note: dict[int, str] = {}
        self.gpu_unavailable: str | None = None
        self._processes: dict[int, Any] = {}
        if visible is ...:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._init_nvml(visible_gpu_filter(visible))
        # cpu_percent(None) compares with the previous call; the first call primes it.
        self._psutil.cpu_percent(None)

    # -- NVML ------------------------------------------------------------------------------------
    def _init_nvml(self, visible: list[str] | None) -> None:
        if self._nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                self.gpu_unavailable = "NVML not available: nvidia-ml-py is not installed"
                return
            self._nvml = nvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError subclasses, OSError from ctypes
            self.gpu_unavailable = _nvml_reason(nvml, exc)
            self._nvml = None
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if visible is not None and not self._is_visible(index, handle, visible):
                    continue
                self._handles.append((index, handle))
                name = nvml.nvmlDeviceGetName(handle)
                self._names[index] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:
            self.gpu_unavailable = f"NVML could not list the GPUs: {exc}"
            self._handles = []
            return
        if not self._handles:
            self.gpu_unavailable = (
                "no NVIDIA GPU visible (NVML found none"
                + (", or CUDA_VISIBLE_DEVICES hides them)" if visible is not None else ")")
            )
            return
        for index, handle in self._handles:
            self._gpm_note[index] = self._gpm_support(handle)

    def _is_visible(self, index: int, handle: Any, visible: list[str]) -> bool:
        if str(index) in visible:
            return True
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(handle)
        except Exception:
            return False
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return any(entry.startswith("GPU-") and uuid.startswith(entry) for entry in visible)

    def _gpm_support(self, handle: Any) -> str:
        """"" if GPM metrics can be read from this GPU, else why not."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return "GPM: not in this nvidia-ml-py"
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except Exception as exc:
            return f"GPM: {exc}"
        if not getattr(support, "isSupportedDevice", 0):
            return "GPM: not supported on this GPU (Hopper or later)"
        return ""

    def _query(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:
            return None

    def _gpm(self, index: int, handle: Any) -> tuple[float | None, float | None]:
        """SM and tensor activity between the previous call and this one."""
        nvml = self._nvml
        try:
            sample = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, sample)
        except Exception as exc:
            self._gpm_note[index] = f"GPM: {exc}"
            return None, None
        previous = self._gpm_previous.get(index)
        self._gpm_previous[index] = sample
        if previous is None:
            return None, None
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.sample1 = previous
            request.sample2 = sample
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            request.metrics[1].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            nvml.nvmlGpmMetricsGet(request)
            values = [
                float(m.value) if m.nvmlReturn == 0 else None for m in request.metrics[:2]
            ]
        except Exception as exc:
            self._gpm_note[index] = f"GPM: {exc}"
            values = [None, None]
        finally:
            try:
                nvml.nvmlGpmSampleFree(previous)
            except Exception:
                pass
        return values[0], values[1]

    def _sample_gpu(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        util = self._query("nvmlDeviceGetUtilizationRates", handle)
        memory = self._query("nvmlDeviceGetMemoryInfo", handle)
        power_mw = self._query("nvmlDeviceGetPowerUsage", handle)
        limit_mw = self._query("nvmlDeviceGetEnforcedPowerLimit", handle)
        temperature = self._query(
            "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        )
        clock_sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        sm_clock = self._query("nvmlDeviceGetClockInfo", handle, clock_sm)
        sm_clock_max = self._query("nvmlDeviceGetMaxClockInfo", handle, clock_sm)
        sm_activity = tensor_activity = None
        if not self._gpm_note.get(index):
            sm_activity, tensor_activity = self._gpm(index, handle)
        return GpuSample(
            index=index,
            name=self._names.get(index, f"GPU {index}"),
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            sm_clock_max_mhz=int(sm_clock_max) if sm_clock_max is not None else None,
            sm_activity_pct=sm_activity,
            tensor_activity_pct=tensor_activity,
            gpm_note=self._gpm_note.get(index, ""),
        )

    # -- psutil ----------------------------------------------------------------------------------
    def _sample_process(self, pid: int | None) -> tuple[ProcessSample | None, str]:
        if pid is None:
            return None, "no worker process"
        ps = self._psutil
        try:
            process = self._processes.get(pid)
            if process is None:
                process = ps.Process(pid)
                process.cpu_percent(None)
                self._processes = {pid: process}
            children = process.children(recursive=True)
            cpu = process.cpu_percent(None)
            rss = process.memory_info().rss
            threads = process.num_threads()
            current = {pid: process}
            for child in children:
                try:
                    # A child seen for the first time reports 0.0 and starts its own clock.
                    known = self._processes.get(child.pid, child)
                    current[child.pid] = known
                    cpu += known.cpu_percent(None)
                    rss += known.memory_info().rss
                except (ps.NoSuchProcess, ps.AccessDenied):
                    continue
            self._processes = current
        except ps.NoSuchProcess:
            return None, f"worker process {pid} has exited"
        except ps.AccessDenied:
            return None, f"not allowed to read process {pid}"
        return ProcessSample(pid, cpu, rss, threads, len(children)), ""

    def _sample_host(self) -> HostSample:
        ps = self._psutil
        memory = ps.virtual_memory()
        return HostSample(
            cpu_percent=float(ps.cpu_percent(None)),
            cpu_count=ps.cpu_count() or 1,
            memory_used_bytes=int(memory.total - memory.available),
            memory_total_bytes=int(memory.total),
        )

    # -- public ----------------------------------------------------------------------------------
    def sample(self, pid: int | None = None) -> TelemetrySample:
        gpus = tuple(self._sample_gpu(i, h) for i, h in self._handles) if self._nvml else ()
        process, note = self._sample_process(pid)
        return TelemetrySample(
            wall_time=time.time(),
            gpus=gpus,
            gpu_unavailable=None if gpus else self.gpu_unavailable,
            host=self._sample_host(),
            process=process,
            process_note=note,
        )

    def close(self) -> None:
        if self._nvml is None:
            return
        for sample in self._gpm_previous.values():
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except Exception:
                pass
        self._gpm_previous.clear()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        self._nvml = None


def main() -> int:
    """`python -m tuner_tui.engine.telemetry`: print two samples a second apart (GPM needs two)."""
    import dataclasses
    import json

    sampler = TelemetrySampler()
    try:
        sampler.sample(os.getpid())
        time.sleep(1.0)
        sample = sampler.sample(os.getpid())
    finally:
        sampler.close()
    print(json.dumps(dataclasses.asdict(sample), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

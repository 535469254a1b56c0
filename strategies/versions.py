"""The versions of what runs under a measurement that torch does not report itself: the GPU
driver (through NVML) and triton. Torch-free; None where one is missing."""

from __future__ import annotations


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            return driver.decode() if isinstance(driver, bytes) else driver
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: unknown
        return None


def triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:
        return None

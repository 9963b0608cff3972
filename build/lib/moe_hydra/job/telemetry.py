"""GPU telemetry through NVML (nvidia-ml-py): power, SM clock, memory, throttle reasons.

Safe without a GPU or driver: :func:`open_gpu` returns None and nothing is sampled.
"""

from __future__ import annotations

from typing import Any


class Gpu:
    """One device, sampled on demand."""

    def __init__(self, pynvml, handle, index: int):
        self._nvml, self._h, self.index = pynvml, handle, index
        self.name = pynvml.nvmlDeviceGetName(handle)
        self.driver = pynvml.nvmlSystemGetDriverVersion()

    def sample(self) -> dict[str, Any]:
        n, h = self._nvml, self._h
        mem = n.nvmlDeviceGetMemoryInfo(h)
        return {
            "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "memory_used_gib": mem.used / 2**30,
            "throttle_reasons": int(n.nvmlDeviceGetCurrentClocksEventReasons(h))
            if hasattr(n, "nvmlDeviceGetCurrentClocksEventReasons")
            else int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        }


def open_gpu(index: int) -> Gpu | None:
    """The GPU at ``index`` (the process's local device), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return Gpu(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index), index)
    except Exception:  # noqa: BLE001 - no driver, no library, no device: no telemetry
        return None

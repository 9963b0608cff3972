"""GPU telemetry through NVML (nvidia-ml-py): power, SM clock, temperature, memory, throttle reasons.

Sampled on a thread of its own (:class:`Gpu` ``start``), never on the training thread: the loop reads the latest
sample (:meth:`Gpu.latest`), which costs a lock. Safe without a GPU or driver: :func:`open_gpu` returns None and
nothing is sampled.
"""

from __future__ import annotations

import threading
from typing import Any

INTERVAL_S = 0.2  # between two samples: NVML's power and clock readings move on this scale


class Gpu:
    """One device, sampled every :data:`INTERVAL_S` on a daemon thread once :meth:`start` is called."""

    def __init__(self, pynvml, handle, index: int):
        self._nvml, self._h, self.index = pynvml, handle, index
        self.name = pynvml.nvmlDeviceGetName(handle)
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        self._latest: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, Any]:
        """One reading now (NVML calls: the sampler thread's work)."""
        n, h = self._nvml, self._h
        mem = n.nvmlDeviceGetMemoryInfo(h)
        return {
            "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "memory_used_gib": mem.used / 2**30,
            "throttle_reasons": int(n.nvmlDeviceGetCurrentClocksEventReasons(h))
            if hasattr(n, "nvmlDeviceGetCurrentClocksEventReasons")
            else int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        }

    def start(self) -> Gpu:
        """Sample on a daemon thread from now on; this device."""
        self._record()  # the first sample before the first step reads it
        self._thread = threading.Thread(target=self._loop, name=f"moe_hydra-nvml-{self.index}", daemon=True)
        self._thread.start()
        return self

    def latest(self) -> dict[str, Any]:
        """The last sample the thread took (a copy)."""
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * INTERVAL_S + 1)

    def _record(self) -> None:
        try:
            values = self.sample()
        except Exception:  # noqa: BLE001 - a reading NVML refuses (a field this GPU lacks) keeps the last one
            return
        with self._lock:
            self._latest = values

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._record()


def open_gpu(index: int) -> Gpu | None:
    """The GPU at ``index`` (the process's local device), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return Gpu(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index), index)
    except Exception:  # noqa: BLE001 - no driver, no library, no device: no telemetry
        return None

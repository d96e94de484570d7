"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Energy comes from ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer)
when every GPU supports it; power is then the energy delta between reads, which averages over
exactly the sampling interval. GPUs without the counter fall back to ``nvmlDeviceGetPowerUsage``
(mW, the driver's own short average), and the sample carries no ``energy_j``. All visible GPUs are
summed. The NVML module is a constructor argument so tests pass a fake library; every NVML error
is translated to PowerSourceError in ``nvml_call`` and nowhere else.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from hetcluster.errors import PowerSourceError
from hetcluster.power._rate import CounterRate
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "nvml"

_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "install the NVIDIA driver (libnvidia-ml.so) or use another power source.",
    "NVML_ERROR_DRIVER_NOT_LOADED": "load the NVIDIA kernel driver (nvidia-smi must work).",
    "NVML_ERROR_NO_PERMISSION": "run the agent as a user allowed to open /dev/nvidia* (group video or root).",
    "NVML_ERROR_NOT_SUPPORTED": "this GPU or driver does not support the query; use another power source.",
    "NVML_ERROR_GPU_IS_LOST": "the GPU fell off the bus; check the host (dmesg) and restart the agent.",
}


def load_nvml(nvml: Any = None) -> Any:
    """The injected library, or ``pynvml``; PowerSourceError when nvidia-ml-py is not installed."""
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError as exc:
        raise PowerSourceError("nvidia-ml-py (pynvml) is not installed.", hint="pip install nvidia-ml-py") from exc
    return pynvml


def _error_code_name(nvml: Any, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    for name in _HINTS:
        if value is not None and getattr(nvml, name, object()) == value:
            return name
    return ""


def nvml_call(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML function; translate NVMLError (and a missing symbol) to PowerSourceError."""
    error_type = getattr(nvml, "NVMLError", None)
    try:
        return fn(*args)
    except Exception as exc:  # narrowed just below: only NVML's own error class is translated
        if error_type is None or not isinstance(exc, error_type):
            raise
        code = _error_code_name(nvml, exc)
        raise PowerSourceError(
            f"NVML {getattr(fn, '__name__', 'call')} failed: {exc}.",
            hint=_HINTS.get(code, "check that nvidia-smi works on this host."),
        ) from exc


def is_not_supported(nvml: Any, error: PowerSourceError) -> bool:
    cause = error.__cause__
    return cause is not None and getattr(cause, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object())


def shutdown_quietly(nvml: Any) -> None:
    """Balance an nvmlInit; a failing shutdown is only logged (there is nothing left to fix)."""
    try:
        nvml_call(nvml, nvml.nvmlShutdown)
    except PowerSourceError as exc:
        log.debug("nvmlShutdown failed: %s", exc)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def list_nvidia_accelerators(nvml: Any = None) -> list[dict]:
    """One dict per NVIDIA GPU (vendor, name, index, uuid, memory_bytes); [] when NVML is absent."""
    try:
        lib = load_nvml(nvml)
        nvml_call(lib, lib.nvmlInit)
    except PowerSourceError as exc:
        log.info("No NVIDIA accelerators listed: %s", exc)
        return []
    try:
        found = []
        for index in range(nvml_call(lib, lib.nvmlDeviceGetCount)):
            handle = nvml_call(lib, lib.nvmlDeviceGetHandleByIndex, index)
            memory = nvml_call(lib, lib.nvmlDeviceGetMemoryInfo, handle)
            found.append(
                {
                    "vendor": "nvidia",
                    "name": _text(nvml_call(lib, lib.nvmlDeviceGetName, handle)),
                    "index": index,
                    "uuid": _text(nvml_call(lib, lib.nvmlDeviceGetUUID, handle)),
                    "memory_bytes": int(memory.total),
                }
            )
        return found
    except PowerSourceError as exc:
        log.warning("Listing NVIDIA GPUs failed: %s", exc)
        return []
    finally:
        shutdown_quietly(lib)


def probe(nvml: Any = None) -> Availability:
    """Whether NVML loads and sees at least one GPU. Never raises."""
    try:
        lib = load_nvml(nvml)
        nvml_call(lib, lib.nvmlInit)
    except PowerSourceError as exc:
        log.info("NVML not available: %s", exc)
        return Availability(NAME, True, False, str(exc))
    except Exception as exc:  # a broken install must not break device info
        log.info("NVML not available: %r", exc)
        return Availability(NAME, True, False, f"NVML failed to load: {exc}")
    try:
        count = nvml_call(lib, lib.nvmlDeviceGetCount)
        if count == 0:
            return Availability(NAME, True, False, "NVML loaded but sees no GPU")
        return Availability(NAME, True, True, f"NVML power of {count} GPU(s)")
    except PowerSourceError as exc:
        return Availability(NAME, True, False, str(exc))
    finally:
        shutdown_quietly(lib)


class NvmlPowerSource(PowerSource):
    """All visible NVIDIA GPUs summed; energy counter when every GPU has one, else sampled power."""

    name = NAME
    measured = True

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = load_nvml(nvml)
        nvml_call(self._nvml, self._nvml.nvmlInit)
        self._open = True
        try:
            count = nvml_call(self._nvml, self._nvml.nvmlDeviceGetCount)
            if count == 0:
                raise PowerSourceError("NVML sees no GPU.", hint="use another power source on this host.")
            self._handles = [nvml_call(self._nvml, self._nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
            self._start_mj = self._energy_counters_mj()
        except BaseException:
            self.close()
            raise
        self._rate = CounterRate(0.0, clock) if self._start_mj is not None else None
        log.info("NVML source on %d GPU(s), energy counter %s", count, "yes" if self._rate else "no")

    @property
    def has_energy_counter(self) -> bool:
        return self._rate is not None

    def describe(self) -> str:
        how = "total energy counters" if self.has_energy_counter else "sampled power usage"
        return f"NVML {how} of {len(self._handles)} GPU(s)"

    def _energy_counters_mj(self) -> list[int] | None:
        """Each GPU's counter, or None when any GPU lacks one (then power is sampled instead)."""
        values = []
        for handle in self._handles:
            try:
                values.append(int(nvml_call(self._nvml, self._nvml.nvmlDeviceGetTotalEnergyConsumption, handle)))
            except PowerSourceError as exc:
                if is_not_supported(self._nvml, exc):
                    return None
                raise
        return values

    def read(self) -> PowerSample:
        if self._rate is None:
            power_mw = sum(nvml_call(self._nvml, self._nvml.nvmlDeviceGetPowerUsage, h) for h in self._handles)
            return self._sample(power_mw / 1000.0)
        self._rate.wait_min_interval()
        now_mj = self._energy_counters_mj() or []
        energy_j = sum(now - start for now, start in zip(now_mj, self._start_mj or [])) / 1000.0
        return self._sample(self._rate.update(energy_j), energy_j=energy_j)

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            shutdown_quietly(self._nvml)

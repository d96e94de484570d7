"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Energy comes from ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer)
when every GPU supports it; samples then carry ``energy_j``, exact over any window. Power is the
driver's own reading, not the counter's delta, which steps every 100 ms
(docs/decisions.md#nvml-power-reading): the instantaneous field ``NVML_FI_DEV_POWER_INSTANT``
where every GPU has it (driver 530 and newer), else ``nvmlDeviceGetPowerUsage`` (mW: a one-second
average on Ampere and newer, instantaneous on older GPUs). All visible GPUs are summed. The NVML module is
a constructor argument so tests pass a fake library; every NVML error is translated to
PowerSourceError in ``nvml_call`` and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from hetcluster.errors import PowerSourceError
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


#: ctypes member of ``c_nvmlValue_t`` holding a field's value, by ``valueType`` (NVML_VALUE_TYPE_*)
_FIELD_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlPowerSource(PowerSource):
    """All visible NVIDIA GPUs summed: the driver's power reading, and the energy counters when
    every GPU has one (see the module docstring for why power is not the counters' delta)."""

    name = NAME
    measured = True

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = load_nvml(nvml)
        nvml_call(self._nvml, self._nvml.nvmlInit)
        self._open = True
        try:
            count = nvml_call(self._nvml, self._nvml.nvmlDeviceGetCount)
            if count == 0:
                raise PowerSourceError("NVML sees no GPU.", hint="use another power source on this host.")
            self._handles = [nvml_call(self._nvml, self._nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
            self._start_mj = self._energy_counters_mj()
            self._instant = self._instant_power_mw() is not None
        except BaseException:
            self.close()
            raise
        log.info("NVML source on %d GPU(s): %s", count, self.describe())

    @property
    def has_energy_counter(self) -> bool:
        return self._start_mj is not None

    def describe(self) -> str:
        power = "instant power" if self._instant else "power usage"
        energy = " and total energy counters" if self.has_energy_counter else ""
        return f"NVML {power}{energy} of {len(self._handles)} GPU(s)"

    def _energy_counters_mj(self) -> list[int] | None:
        """Each GPU's counter, or None when any GPU lacks one (samples then carry no energy)."""
        values = []
        for handle in self._handles:
            try:
                values.append(int(nvml_call(self._nvml, self._nvml.nvmlDeviceGetTotalEnergyConsumption, handle)))
            except PowerSourceError as exc:
                if is_not_supported(self._nvml, exc):
                    return None
                raise
        return values

    def _instant_power_mw(self) -> list[float] | None:
        """Each GPU's NVML_FI_DEV_POWER_INSTANT, or None when the library, driver or any GPU lacks it."""
        field = getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is None or getattr(self._nvml, "nvmlDeviceGetFieldValues", None) is None:
            return None
        values = []
        for handle in self._handles:
            try:
                (value,) = nvml_call(self._nvml, self._nvml.nvmlDeviceGetFieldValues, handle, [field])
            except PowerSourceError as exc:  # an old driver has no field API
                log.debug("NVML field values unavailable: %s", exc)
                return None
            if value.nvmlReturn != getattr(self._nvml, "NVML_SUCCESS", 0) or value.valueType >= len(
                _FIELD_VALUE_MEMBERS
            ):
                return None
            values.append(float(getattr(value.value, _FIELD_VALUE_MEMBERS[value.valueType])))
        return values

    def _power_w(self) -> float:
        if self._instant:
            instant_mw = self._instant_power_mw()
            if instant_mw is not None:
                return sum(instant_mw) / 1000.0
            log.warning("NVML instant power stopped answering; using nvmlDeviceGetPowerUsage from now on")
            self._instant = False
        return sum(nvml_call(self._nvml, self._nvml.nvmlDeviceGetPowerUsage, h) for h in self._handles) / 1000.0

    def read(self) -> PowerSample:
        power_w = self._power_w()
        if self._start_mj is None:
            return self._sample(power_w)
        now_mj = self._energy_counters_mj() or []
        energy_j = sum(now - start for now, start in zip(now_mj, self._start_mj)) / 1000.0
        return self._sample(power_w, energy_j=energy_j)

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            shutdown_quietly(self._nvml)

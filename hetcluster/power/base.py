"""The power-source interface every backend implements.

A source reads one sample at a time; the agent's sampler calls `read()` at the requested rate.
Sources that have an energy counter report cumulative `energy_j` (since the source was opened);
the rest report `energy_j=None` and consumers integrate `power_w` over time. Every sample names
its source and says whether it was measured or modeled.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PowerSample:
    monotonic_s: float
    wall_time_s: float
    power_w: float
    source: str
    measured: bool
    energy_j: float | None = None
    utilization: float = 0.0


class PowerSource(abc.ABC):
    """One way of knowing a device's power draw."""

    #: short stable name: "rapl", "nvml", "jetson_ina3221", "android_battery", "pi5_pmic", "model"
    #: (modeled, emulated devices included) or parts joined by "+" ("rapl+nvml")
    name: str = ""
    #: False for modeled sources
    measured: bool = True

    @abc.abstractmethod
    def read(self) -> PowerSample:
        """Return the current power draw (raises PowerSourceError when it cannot)."""

    def close(self) -> None:
        """Release handles (NVML, files); the default holds none."""

    def describe(self) -> str:
        """One line saying what is read, for GetDeviceInfo."""
        return self.name

    def _sample(self, power_w: float, energy_j: float | None = None, utilization: float = 0.0) -> PowerSample:
        return PowerSample(
            monotonic_s=time.monotonic(),
            wall_time_s=time.time(),
            power_w=float(power_w),
            source=self.name,
            measured=self.measured,
            energy_j=energy_j,
            utilization=utilization,
        )


@dataclass(frozen=True)
class Availability:
    """What a probe found: whether a source can be opened here, and why (not).

    Probes never raise: they return ``available=False`` with the reason in ``detail``, so
    ``GetDeviceInfo`` can list every source with an explanation (proto ``PowerSourceInfo``).
    """

    name: str
    measured: bool
    available: bool
    detail: str

"""The fallback when nothing is measured: power modeled from system-wide CPU utilization.

P = idle_w + (busy_w − idle_w) · u, with u the psutil CPU utilization (all cores) since the previous
read. idle_w and busy_w come from the configuration, else from a small table keyed by substrings of
the CPU model name (whole-package or whole-board figures, rough by nature), else a generic default.
Samples are always ``measured=False`` with source ``model``; treat them as estimates.
"""

from __future__ import annotations

import logging
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hetcluster.errors import PowerSourceError
from hetcluster.power._sysfs import read_optional
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "model"


@dataclass(frozen=True)
class TdpEntry:
    match: str  # case-insensitive substring of the CPU model name
    idle_w: float
    busy_w: float


#: First match wins, so specific names precede generic ones. Figures: package idle / sustained TDP
#: for server and desktop CPUs, whole-board idle / loaded for SoCs.
TDP_TABLE: tuple[TdpEntry, ...] = (
    TdpEntry("Xeon Platinum", 60.0, 250.0),
    TdpEntry("Xeon Gold", 45.0, 165.0),
    TdpEntry("Xeon Silver", 35.0, 100.0),
    TdpEntry("Xeon", 40.0, 140.0),
    TdpEntry("EPYC", 60.0, 240.0),
    TdpEntry("Threadripper", 50.0, 280.0),
    TdpEntry("Ryzen 9", 25.0, 142.0),
    TdpEntry("Ryzen 7", 20.0, 88.0),
    TdpEntry("Ryzen 5", 15.0, 65.0),
    TdpEntry("Core i9", 20.0, 125.0),
    TdpEntry("Core i7", 15.0, 65.0),
    TdpEntry("Core i5", 10.0, 65.0),
    TdpEntry("Core i3", 8.0, 58.0),
    TdpEntry("Carmel", 5.0, 20.0),  # Jetson Xavier NX / AGX module
    TdpEntry("Cortex-A78AE", 5.0, 25.0),  # Jetson Orin
    TdpEntry("Cortex-A76", 2.7, 8.0),  # Raspberry Pi 5
    TdpEntry("Cortex-A72", 2.7, 6.4),  # Raspberry Pi 4
    TdpEntry("Cortex-A57", 1.5, 7.5),  # Jetson Nano / TX2
    TdpEntry("Cortex-A53", 1.4, 3.7),  # Raspberry Pi 3
)
DEFAULT_ENTRY = TdpEntry("", 10.0, 65.0)

#: (implementer, part) from /proc/cpuinfo on ARM, where "model name" is not descriptive.
_ARM_PARTS = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd07"): "Cortex-A57",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd42"): "Cortex-A78AE",
    ("0x4e", "0x004"): "Carmel",
}


def cpu_model_name(root: Path = Path("/")) -> str:
    """A descriptive CPU model name from ``proc/cpuinfo`` (x86 model name or ARM part), else platform."""
    text = read_optional(root / "proc/cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    part = _ARM_PARTS.get((fields.get("cpu implementer", "").lower(), fields.get("cpu part", "").lower()))
    if part:
        return part
    return fields.get("model name") or platform.processor() or platform.machine()


def _normalized(name: str) -> str:
    """Lower case without trademark marks: "Intel(R) Xeon(R) Gold" → "intel xeon gold"."""
    return " ".join(re.sub(r"\((r|tm)\)", " ", name.lower()).split())


def tdp_for(cpu_model: str) -> TdpEntry:
    """The table entry matching the CPU model name, or the generic default."""
    name = _normalized(cpu_model)
    for entry in TDP_TABLE:
        if _normalized(entry.match) in name:
            return entry
    return DEFAULT_ENTRY


def probe(root: Path = Path("/")) -> Availability:
    """The model is always available; the detail names the figures it would use."""
    entry = tdp_for(cpu_model_name(root))
    which = f"TDP table entry {entry.match!r}" if entry.match else "generic default"
    return Availability(NAME, False, True, f"CPU utilization model, {which}: {entry.idle_w:g}–{entry.busy_w:g} W")


def _system_utilization() -> Callable[[], float]:
    import psutil

    psutil.cpu_percent(interval=None)  # the first call only starts the interval
    return lambda: psutil.cpu_percent(interval=None) / 100.0


class UtilizationModelSource(PowerSource):
    """idle_w + (busy_w − idle_w) · system CPU utilization since the previous read."""

    name = NAME
    measured = False

    def __init__(
        self,
        idle_w: float | None = None,
        busy_w: float | None = None,
        cpu_model: str | None = None,
        utilization: Callable[[], float] | None = None,
    ) -> None:
        self.cpu_model = cpu_model if cpu_model is not None else cpu_model_name()
        entry = tdp_for(self.cpu_model)
        self.idle_w = entry.idle_w if idle_w is None else float(idle_w)
        self.busy_w = entry.busy_w if busy_w is None else float(busy_w)
        if not 0 <= self.idle_w <= self.busy_w:
            raise PowerSourceError(
                f"Model power needs 0 <= idle_w <= busy_w, got idle_w={self.idle_w} busy_w={self.busy_w}.",
                hint="fix idle_w/busy_w in the [power] table.",
            )
        self._utilization = utilization or _system_utilization()

    def describe(self) -> str:
        return f"modeled from CPU utilization ({self.cpu_model}): {self.idle_w:g} W idle, {self.busy_w:g} W busy"

    def read(self) -> PowerSample:
        u = min(1.0, max(0.0, self._utilization()))
        return self._sample(self.idle_w + (self.busy_w - self.idle_w) * u, utilization=u)

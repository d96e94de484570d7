"""Android phones (e.g. under Termux): the battery's ``power_supply`` class in sysfs.

Reads ``sys/class/power_supply/<supply>/{status,current_now,voltage_now}`` of the supply named
``battery`` or, failing that, the first supply whose ``type`` is ``Battery``.

Units: the kernel ABI says µA and µV, but some vendors report mA and mV. They are told apart by
magnitude: a phone draws 20 mA to a few A, i.e. 20 000 to several million µA, so |current| below
20 000 is taken as mA; a Li-ion cell sits at 3–4.5 V, so a voltage below 100 is taken as V, below
100 000 as mV, and µV otherwise. Sign: vendors disagree on whether discharge is positive or negative,
so the absolute discharge power |V·I| is reported.

While the status is ``Charging``, ``Full`` or ``Not charging`` (plugged in but paused) the phone runs
from the charger and the battery current says nothing about the device's draw, so reads are refused
with PowerSourceError.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hetcluster.errors import PowerSourceError
from hetcluster.power._sysfs import read_int, read_optional, read_text
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "android_battery"
SUPPLY_DIR = "sys/class/power_supply"
PLUGGED_STATUSES = ("charging", "full", "not charging")
_MA_BELOW = 20_000
_V_BELOW = 100
_MV_BELOW = 100_000


def find_battery(root: Path = Path("/")) -> Path | None:
    """The battery supply directory, or None."""
    base = root / SUPPLY_DIR
    preferred = base / "battery"
    if (preferred / "current_now").exists():
        return preferred
    for supply in sorted(base.glob("*")):
        if (read_optional(supply / "type") or "").lower() == "battery" and (supply / "current_now").exists():
            return supply
    return None


def current_a(raw: int) -> float:
    """current_now in A, from µA (kernel ABI) or mA (some vendors), told apart by magnitude."""
    return raw / 1e3 if abs(raw) < _MA_BELOW else raw / 1e6


def voltage_v(raw: int) -> float:
    """voltage_now in V, from µV (kernel ABI), mV or V, told apart by magnitude."""
    if abs(raw) < _V_BELOW:
        return float(raw)
    return raw / 1e3 if abs(raw) < _MV_BELOW else raw / 1e6


def probe(root: Path = Path("/")) -> Availability:
    """Whether a readable battery supply exists (the detail says if it is charging). Never raises."""
    supply = find_battery(root)
    if supply is None:
        return Availability(NAME, True, False, f"no battery under {root / SUPPLY_DIR}")
    try:
        status = read_text(supply / "status")
        read_int(supply / "current_now")
        read_int(supply / "voltage_now")
    except PowerSourceError as exc:
        log.info("Android battery not available: %s", exc)
        return Availability(NAME, True, False, str(exc))
    note = " (plugged in: reads refused until unplugged)" if status.lower() in PLUGGED_STATUSES else ""
    return Availability(NAME, True, True, f"battery {supply.name} current_now × voltage_now, status {status}{note}")


def is_plugged(root: Path = Path("/")) -> bool:
    """True when the battery reports Charging/Full/Not charging (auto-detection then skips it)."""
    supply = find_battery(root)
    status = read_optional(supply / "status") if supply else None
    return (status or "").lower() in PLUGGED_STATUSES


class AndroidBatteryPowerSource(PowerSource):
    """Discharge power |V·I| of the phone's battery; refuses while the charger powers the phone."""

    name = NAME
    measured = True

    def __init__(self, root: Path = Path("/")) -> None:
        supply = find_battery(root)
        if supply is None:
            raise PowerSourceError(
                f"No battery supply under {root / SUPPLY_DIR}.",
                hint="this device has no readable battery; use source = \"auto\".",
            )
        self.supply = supply

    def describe(self) -> str:
        return f"Android battery {self.supply.name}: |current_now × voltage_now| while discharging"

    def read(self) -> PowerSample:
        status = read_text(self.supply / "status")
        if status.lower() in PLUGGED_STATUSES:
            raise PowerSourceError(
                f"The battery is {status!r}: the charger powers the device, so battery power is meaningless.",
                hint="unplug the phone while measuring, or use source = \"model\".",
            )
        power_w = abs(
            current_a(read_int(self.supply / "current_now")) * voltage_v(read_int(self.supply / "voltage_now"))
        )
        return self._sample(power_w)

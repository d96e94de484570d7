"""NVIDIA Jetson boards: the INA3221 power monitors on the module's rails.

Two kernel layouts exist:

* older L4T (TX1/TX2/Nano/Xavier on 4.9 kernels): the ``ina3221x`` iio driver,
  ``sys/bus/i2c/drivers/ina3221x/*/iio:device*/in_power<k>_input`` in mW, rail names in
  ``rail_name_<k>``;
* newer L4T (Orin, 5.10+ kernels): the mainline ``ina3221`` hwmon driver,
  ``sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in<k>_input`` bus voltage in mV and
  ``curr<k>_input`` current in mA for channels k = 1..3, labels in ``in<k>_label`` (the hwmon
  index differs per boot, hence the glob). in4..in7 are shunt voltages and are not used.

Which rails are summed: channels labelled ``NC`` (not connected) are skipped. If any rail is an
input/total rail (its name ends in ``IN``: ``VDD_IN``, ``POM_5V_IN``, ``VDD_SYS_IN``) those rails
are used alone, since the other rails (``VDD_CPU_GPU_CV``, ``VDD_SOC``, ``POM_5V_GPU`` ...) are
parts of it; otherwise (e.g. AGX Xavier: GPU, CPU, SOC, CV, VDDRQ, SYS5V) every rail is summed.
Power is instantaneous; there is no energy counter.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from hetcluster.errors import PowerSourceError
from hetcluster.power._sysfs import read_int, read_optional
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "jetson_ina3221"
IIO_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"
HWMON_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
#: The INA3221's three channels; curr4 is their summed current and in4..in7 are shunt voltages.
HWMON_CHANNELS = (1, 2, 3)
_TOTAL_RAIL_RE = re.compile(r"(?:^|_)IN$", re.IGNORECASE)


@dataclass(frozen=True)
class Rail:
    """One monitored rail: either a direct power file (mW) or a voltage (mV) × current (mA) pair."""

    name: str
    power_mw_path: Path | None = None
    voltage_mv_path: Path | None = None
    current_ma_path: Path | None = None

    def power_w(self) -> float:
        if self.power_mw_path is not None:
            return read_int(self.power_mw_path) / 1000.0
        assert self.voltage_mv_path is not None and self.current_ma_path is not None
        return read_int(self.voltage_mv_path) * read_int(self.current_ma_path) / 1e6


def _iio_rails(root: Path) -> list[Rail]:
    rails = []
    for device in sorted(root.glob(IIO_GLOB)):
        for power_path in sorted(device.glob("in_power*_input")):
            channel = power_path.name[len("in_power") : -len("_input")]
            name = read_optional(device / f"rail_name_{channel}") or f"{device.parent.name}/ch{channel}"
            rails.append(Rail(name, power_mw_path=power_path))
    return rails


def _hwmon_rails(root: Path) -> list[Rail]:
    rails = []
    for hwmon in sorted(root.glob(HWMON_GLOB)):
        for channel in HWMON_CHANNELS:
            current_path = hwmon / f"curr{channel}_input"
            voltage_path = hwmon / f"in{channel}_input"
            if not (current_path.exists() and voltage_path.exists()):
                continue  # channel disabled in the device tree
            name = read_optional(hwmon / f"in{channel}_label") or f"{hwmon.parent.parent.name}/ch{channel}"
            rails.append(Rail(name, voltage_mv_path=voltage_path, current_ma_path=current_path))
    return rails


def select_rails(rails: list[Rail]) -> list[Rail]:
    """Connected rails; the input/total rails alone when there are any (see module docstring)."""
    connected = [r for r in rails if r.name.upper() != "NC"]
    totals = [r for r in connected if _TOTAL_RAIL_RE.search(r.name)]
    return totals or connected


def find_rails(root: Path = Path("/")) -> tuple[str, list[Rail]]:
    """The layout found ("iio" or "hwmon") and the rails to sum."""
    iio = _iio_rails(root)
    if iio:
        return "iio", select_rails(iio)
    return "hwmon", select_rails(_hwmon_rails(root))


def probe(root: Path = Path("/")) -> Availability:
    """Whether INA3221 rails exist and read. Never raises."""
    try:
        layout, rails = find_rails(root)
        if not rails:
            return Availability(
                NAME, True, False, "no INA3221 rails (not a Jetson, or the ina3221 driver is not loaded)"
            )
        for rail in rails:
            rail.power_w()
        return Availability(NAME, True, True, f"INA3221 {layout}: {' + '.join(r.name for r in rails)}")
    except (PowerSourceError, OSError) as exc:
        log.info("Jetson INA3221 not available: %s", exc)
        return Availability(NAME, True, False, str(exc))


class JetsonPowerSource(PowerSource):
    """Sum of the selected INA3221 rails, read at each sample."""

    name = NAME
    measured = True

    def __init__(self, root: Path = Path("/")) -> None:
        self.layout, self.rails = find_rails(root)
        if not self.rails:
            raise PowerSourceError(
                f"No INA3221 rails under {root / IIO_GLOB} or {root / HWMON_GLOB}.",
                hint="this is not a Jetson or the ina3221 driver is not loaded; use source = \"auto\".",
            )

    @property
    def rail_names(self) -> list[str]:
        return [r.name for r in self.rails]

    def describe(self) -> str:
        return f"Jetson INA3221 ({self.layout}) rails {' + '.join(self.rail_names)}"

    def read(self) -> PowerSample:
        return self._sample(sum(rail.power_w() for rail in self.rails))

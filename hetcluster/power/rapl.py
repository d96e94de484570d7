"""Intel/AMD RAPL through the Linux powercap interface (``/sys/class/powercap/intel-rapl:*``).

Each zone has a cumulative ``energy_uj`` counter that wraps at ``max_energy_range_uj``. Zones nest
(``intel-rapl:0`` package-0 contains ``intel-rapl:0:0`` core, ``intel-rapl:0:1`` uncore, and on
servers ``intel-rapl:0:2`` dram), and a ``psys`` (platform) zone contains the packages. Summing every
zone would count the same joules two or three times, so the zones summed are:

* ``psys`` alone when the platform exposes it (it covers package, DRAM and the rest of the SoC);
* otherwise every ``package-N`` zone plus every ``dram`` zone. The DRAM domain is a separate
  counter, not part of the package domain, even though sysfs lists it as a subzone of the package;
  ``core``/``uncore`` (pp0/pp1) are inside the package and are never summed.

AMD processors are served by the same driver and the same ``intel-rapl`` names. The
``intel-rapl-mmio:*`` zones duplicate the MSR package counter and are ignored (the glob excludes
them). A counter that decreases between reads has wrapped once: ``delta += max_energy_range_uj``.
Two wraps between reads cannot be seen: the typical range of 262 143 328 850 µJ lasts ~15 min at
300 W and even a 2^32 µJ range lasts ~14 s, far longer than the agent's sampling interval.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hetcluster.errors import PowerSourceError
from hetcluster.power._rate import CounterRate
from hetcluster.power._sysfs import read_int, read_optional
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "rapl"
POWERCAP_DIR = "sys/class/powercap"
_ZONE_RE = re.compile(r"^intel-rapl:(\d+(?::\d+)*)$")


@dataclass
class _Zone:
    path: Path
    name: str
    max_range_uj: int | None
    last_uj: int
    energy_uj: int = 0  # accumulated since open, wrap-corrected


def zone_dirs(root: Path) -> list[tuple[Path, str]]:
    """Every ``intel-rapl:*`` zone (top-level and subzones) with its ``name``, sorted by id."""
    base = root / POWERCAP_DIR
    found = []
    for path in sorted(base.glob("intel-rapl:*")):
        if _ZONE_RE.match(path.name):
            found.append((path, read_optional(path / "name") or ""))
    return found


def select_zones(zones: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """The zones whose energies add up without overlap (see the module docstring)."""
    psys = [(p, n) for p, n in zones if n == "psys"]
    if psys:
        return psys
    return [(p, n) for p, n in zones if n.startswith("package") or n == "dram"]


def probe(root: Path = Path("/")) -> Availability:
    """Whether RAPL zones exist here and their counters can be read. Never raises."""
    try:
        selected = select_zones(zone_dirs(root))
        if not selected:
            return Availability(NAME, True, False, f"no package or psys zone under {root / POWERCAP_DIR}")
        for path, _ in selected:
            read_int(path / "energy_uj")
        names = ", ".join(n for _, n in selected)
        return Availability(NAME, True, True, f"powercap energy_uj of {names}")
    except PowerSourceError as exc:
        log.info("RAPL not available: %s", exc)
        return Availability(NAME, True, False, str(exc))
    except OSError as exc:
        log.info("RAPL not available: %s", exc)
        return Availability(NAME, True, False, f"cannot list {root / POWERCAP_DIR}: {exc}")


class RaplPowerSource(PowerSource):
    """Sum of the non-overlapping RAPL zones; power from the energy delta between reads."""

    name = NAME
    measured = True

    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic) -> None:
        selected = select_zones(zone_dirs(root))
        if not selected:
            raise PowerSourceError(
                f"No RAPL package or psys zone under {root / POWERCAP_DIR}.",
                hint="this CPU or kernel has no powercap RAPL; use source = \"model\" or \"auto\".",
            )
        self._zones = []
        for path, name in selected:
            try:
                max_range = read_int(path / "max_energy_range_uj")
            except PowerSourceError:
                log.warning("RAPL zone %s has no readable max_energy_range_uj; wraps will be skipped", path)
                max_range = None
            self._zones.append(_Zone(path, name, max_range, read_int(path / "energy_uj")))
        self._rate = CounterRate(0.0, clock)

    @property
    def zone_names(self) -> list[str]:
        return [z.name for z in self._zones]

    def describe(self) -> str:
        return f"RAPL powercap energy counters: {' + '.join(self.zone_names)}"

    def _advance(self) -> float:
        """Read every zone, add wrap-corrected deltas, return joules since open."""
        for zone in self._zones:
            now_uj = read_int(zone.path / "energy_uj")
            delta_uj = now_uj - zone.last_uj
            if delta_uj < 0:
                if zone.max_range_uj is None:
                    log.warning("RAPL zone %s went backwards with no known range; interval skipped", zone.name)
                    delta_uj = 0
                else:
                    delta_uj += zone.max_range_uj
            zone.energy_uj += delta_uj
            zone.last_uj = now_uj
        return sum(z.energy_uj for z in self._zones) / 1e6

    def read(self) -> PowerSample:
        self._rate.wait_min_interval()
        energy_j = self._advance()
        power_w = self._rate.update(energy_j)
        return self._sample(power_w, energy_j=energy_j)

"""Raspberry Pi 5: the PMIC's rail ADCs, read with ``vcgencmd pmic_read_adc``.

The command prints one line per measurement, e.g.::

       VDD_CORE_A current(7)=2.52900000A
       VDD_CORE_V volt(15)=0.88500000V

Currents (``<RAIL>_A``) are paired with voltages (``<RAIL>_V``) by rail name and power is
Σ V·I over the paired rails. Unpaired readings (``EXT5V_V``, ``BATT_V``) are ignored. Caveat: the
PMIC rails are the SoC's and memory's supplies after regulation; the 5 V input (USB peripherals,
fan, regulator losses) is not measured, so this under-reads the wall power of the board.
The command runner is injectable so tests parse recorded output.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from hetcluster.errors import PowerSourceError
from hetcluster.power._sysfs import read_optional
from hetcluster.power.base import Availability, PowerSample, PowerSource

log = logging.getLogger(__name__)

NAME = "pi5_pmic"
COMMAND = ["vcgencmd", "pmic_read_adc"]
MODEL_FILES = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")
_LINE_RE = re.compile(r"^\s*(?P<rail>\S+)_(?P<kind>[AV])\s+(?:current|volt)\(\d+\)=(?P<value>[-+0-9.eE]+)[AV]\s*$")

Runner = Callable[[list[str]], str]


def run_command(argv: list[str]) -> str:
    """Run vcgencmd; PowerSourceError saying how to fix it when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        raise PowerSourceError(
            f"{argv[0]} is not installed or not on PATH.",
            hint="install the Raspberry Pi userland tools (apt install libraspberrypi-bin or raspi-utils).",
        )
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5.0, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PowerSourceError(
            f"{' '.join(argv)} failed: {exc}.", hint="check that vcgencmd works in a shell."
        ) from exc
    if done.returncode != 0:
        raise PowerSourceError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}.",
            hint="add the agent's user to the video group (access to /dev/vcio) and use a Raspberry Pi 5 firmware.",
        )
    return done.stdout


def parse_pmic_adc(text: str) -> dict[str, tuple[float, float]]:
    """Rail name → (volts, amps) for rails with both readings."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE_RE.match(line)
        if match is None:
            continue
        target = amps if match["kind"] == "A" else volts
        target[match["rail"]] = float(match["value"])
    return {rail: (volts[rail], amps[rail]) for rail in amps if rail in volts}


def total_power_w(rails: dict[str, tuple[float, float]]) -> float:
    return sum(v * a for v, a in rails.values())


def is_pi5(root: Path = Path("/")) -> bool:
    for name in MODEL_FILES:
        model = read_optional(root / name)
        if model and "raspberry pi 5" in model.lower():
            return True
    return False


def probe(root: Path = Path("/"), runner: Runner | None = None) -> Availability:
    """Whether this is a Pi 5 and vcgencmd reports paired rails. Never raises."""
    if not is_pi5(root):
        return Availability(NAME, True, False, "not a Raspberry Pi 5 (device-tree model)")
    try:
        rails = parse_pmic_adc((runner or run_command)(COMMAND))
    except PowerSourceError as exc:
        log.info("Pi 5 PMIC not available: %s", exc)
        return Availability(NAME, True, False, str(exc))
    if not rails:
        return Availability(NAME, True, False, "vcgencmd pmic_read_adc printed no current/voltage pairs")
    return Availability(NAME, True, True, f"PMIC ADC, {len(rails)} rails (V·I summed)")


class Pi5PowerSource(PowerSource):
    """Σ V·I over the PMIC rails, one vcgencmd call per sample (~10 ms each)."""

    name = NAME
    measured = True

    def __init__(self, runner: Runner | None = None) -> None:
        self._runner = runner or run_command
        rails = parse_pmic_adc(self._runner(COMMAND))
        if not rails:
            raise PowerSourceError(
                "vcgencmd pmic_read_adc printed no current/voltage pairs.",
                hint="this firmware or board has no PMIC ADC (Raspberry Pi 5 only); use source = \"model\".",
            )
        self.rail_names = sorted(rails)

    def describe(self) -> str:
        return f"Raspberry Pi 5 PMIC ADC, Σ V·I over {len(self.rail_names)} rails"

    def read(self) -> PowerSample:
        rails = parse_pmic_adc(self._runner(COMMAND))
        if not rails:
            raise PowerSourceError(
                "vcgencmd pmic_read_adc printed no current/voltage pairs.", hint="check the firmware."
            )
        return self._sample(total_power_w(rails))

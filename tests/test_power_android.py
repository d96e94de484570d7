"""Android battery on fake power_supply trees: units, signs, and refusal while plugged in."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import android
from hetcluster.power.android import AndroidBatteryPowerSource


def supply(root: Path, name: str, *, kind: str, status: str, current: int, voltage: int) -> Path:
    path = root / "sys/class/power_supply" / name
    path.mkdir(parents=True)
    (path / "type").write_text(kind + "\n")
    (path / "status").write_text(status + "\n")
    (path / "current_now").write_text(f"{current}\n")
    (path / "voltage_now").write_text(f"{voltage}\n")
    return path


@pytest.mark.parametrize(
    ("current", "voltage", "expected_w"),
    [
        (850_000, 3_900_000, 0.85 * 3.9),  # µA, µV, discharge positive
        (-850_000, 3_900_000, 0.85 * 3.9),  # µA, µV, discharge negative (e.g. Pixel)
        (1_250, 4_100, 1.25 * 4.1),  # mA, mV (some vendors)
        (-1_250, 4_100_000, 1.25 * 4.1),  # mA with µV, negative
        (2_400_000, 4_200, 2.4 * 4.2),  # µA with mV
    ],
)
def test_discharge_power_in_every_unit_and_sign(tmp_path: Path, current: int, voltage: int, expected_w: float) -> None:
    supply(tmp_path, "battery", kind="Battery", status="Discharging", current=current, voltage=voltage)
    sample = AndroidBatteryPowerSource(tmp_path).read()
    assert sample.power_w == pytest.approx(expected_w)
    assert sample.source == "android_battery" and sample.measured and sample.energy_j is None


@pytest.mark.parametrize("status", ["Charging", "Full", "Not charging"])
def test_refuses_while_plugged_in(tmp_path: Path, status: str) -> None:
    path = supply(tmp_path, "battery", kind="Battery", status=status, current=-500_000, voltage=4_300_000)
    source = AndroidBatteryPowerSource(tmp_path)
    with pytest.raises(PowerSourceError, match="charger") as caught:
        source.read()
    assert "unplug" in str(caught.value)
    availability = android.probe(tmp_path)
    assert availability.available and "plugged in" in availability.detail
    # Unplugging makes the same source readable again.
    (path / "status").write_text("Discharging\n")
    assert source.read().power_w == pytest.approx(0.5 * 4.3)


def test_finds_a_battery_by_type_when_not_named_battery(tmp_path: Path) -> None:
    supply(tmp_path, "usb", kind="USB", status="Unknown", current=900_000, voltage=5_000_000)
    supply(tmp_path, "bms", kind="Battery", status="Discharging", current=600_000, voltage=3_800_000)
    source = AndroidBatteryPowerSource(tmp_path)
    assert source.supply.name == "bms"
    assert source.read().power_w == pytest.approx(0.6 * 3.8)


def test_no_battery(tmp_path: Path) -> None:
    supply(tmp_path, "AC", kind="Mains", status="Unknown", current=0, voltage=0)
    assert not android.probe(tmp_path).available
    with pytest.raises(PowerSourceError, match="No battery"):
        AndroidBatteryPowerSource(tmp_path)


def test_unit_detection_thresholds() -> None:
    assert android.current_a(19_999) == pytest.approx(19.999)  # mA
    assert android.current_a(20_000) == pytest.approx(0.02)  # µA
    assert android.voltage_v(4) == 4.0
    assert android.voltage_v(3_700) == pytest.approx(3.7)
    assert android.voltage_v(3_700_000) == pytest.approx(3.7)

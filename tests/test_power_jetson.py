"""Jetson INA3221 on fake sysfs trees of both kernel layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import jetson
from hetcluster.power.jetson import JetsonPowerSource


def iio_board(root: Path, address: str, rails: list[tuple[str, int]], index: int = 0) -> Path:
    """Older L4T: ina3221x iio device with in_power<k>_input (mW) and rail_name_<k>."""
    device = root / "sys/bus/i2c/drivers/ina3221x" / address / f"iio:device{index}"
    device.mkdir(parents=True)
    for channel, (name, power_mw) in enumerate(rails):
        (device / f"rail_name_{channel}").write_text(name + "\n")
        (device / f"in_power{channel}_input").write_text(f"{power_mw}\n")
        (device / f"in_current{channel}_input").write_text("0\n")
        (device / f"in_voltage{channel}_input").write_text("5000\n")
    return device


def hwmon_board(root: Path, address: str, hwmon_index: int, rails: list[tuple[str, int, int]]) -> Path:
    """Newer L4T: ina3221 hwmon with in<k>_input (mV), curr<k>_input (mA), in<k>_label."""
    hwmon = root / "sys/bus/i2c/drivers/ina3221" / address / "hwmon" / f"hwmon{hwmon_index}"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("ina3221\n")
    for channel, (label, voltage_mv, current_ma) in enumerate(rails, start=1):
        (hwmon / f"in{channel}_label").write_text(label + "\n")
        (hwmon / f"in{channel}_input").write_text(f"{voltage_mv}\n")
        (hwmon / f"curr{channel}_input").write_text(f"{current_ma}\n")
        (hwmon / f"in{channel + 3}_input").write_text("12\n")  # shunt voltages, unused
    (hwmon / "in7_input").write_text("36\n")  # sum of shunt voltages
    (hwmon / "curr4_input").write_text("9999\n")  # summed current: no bus voltage, ignored
    return hwmon


def test_iio_tx2_uses_the_input_rail_alone(tmp_path: Path) -> None:
    iio_board(tmp_path, "0-0040", [("VDD_SYS_GPU", 1500), ("VDD_SYS_SOC", 800), ("VDD_4V0_WIFI", 100)], index=0)
    device = iio_board(tmp_path, "0-0041", [("VDD_IN", 4200), ("VDD_SYS_CPU", 900), ("VDD_SYS_DDR", 600)], index=1)
    source = JetsonPowerSource(tmp_path)
    assert source.layout == "iio"
    assert source.rail_names == ["VDD_IN"]
    assert source.read().power_w == pytest.approx(4.2)
    (device / "in_power0_input").write_text("6100\n")
    sample = source.read()
    assert sample.power_w == pytest.approx(6.1)
    assert sample.source == "jetson_ina3221" and sample.measured and sample.energy_j is None


def test_iio_nano_pom_input_rail(tmp_path: Path) -> None:
    iio_board(tmp_path, "6-0040", [("POM_5V_IN", 3100), ("POM_5V_GPU", 400), ("POM_5V_CPU", 900)])
    source = JetsonPowerSource(tmp_path)
    assert source.rail_names == ["POM_5V_IN"]
    assert source.read().power_w == pytest.approx(3.1)


def test_iio_without_total_rail_sums_every_rail(tmp_path: Path) -> None:
    # AGX Xavier: no input rail, the module power is the sum of its rails.
    iio_board(tmp_path, "1-0040", [("GPU", 2000), ("CPU", 3000), ("SOC", 1000)], index=0)
    iio_board(tmp_path, "1-0041", [("CV", 500), ("VDDRQ", 700), ("SYS5V", 1800)], index=1)
    source = JetsonPowerSource(tmp_path)
    assert len(source.rail_names) == 6
    assert source.read().power_w == pytest.approx(9.0)


def test_hwmon_orin_nano_multiplies_mv_by_ma(tmp_path: Path) -> None:
    hwmon = hwmon_board(
        tmp_path, "1-0040", 3, [("VDD_IN", 5080, 1220), ("VDD_CPU_GPU_CV", 5072, 300), ("VDD_SOC", 5072, 400)]
    )
    source = JetsonPowerSource(tmp_path)
    assert source.layout == "hwmon"
    assert source.rail_names == ["VDD_IN"]
    assert source.read().power_w == pytest.approx(5.080 * 1.220)
    (hwmon / "curr1_input").write_text("2000\n")
    assert source.read().power_w == pytest.approx(5.080 * 2.0)


def test_hwmon_agx_orin_skips_unconnected_channels(tmp_path: Path) -> None:
    hwmon_board(
        tmp_path, "1-0040", 1, [("VDD_GPU_SOC", 5000, 1000), ("VDD_CPU_CV", 5000, 600), ("VIN_SYS_5V0", 5000, 400)]
    )
    hwmon_board(tmp_path, "1-0041", 2, [("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 5000, 200), ("NC", 0, 0)])
    source = JetsonPowerSource(tmp_path)
    assert sorted(source.rail_names) == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC", "VIN_SYS_5V0"]
    assert source.read().power_w == pytest.approx(5.0 * (1.0 + 0.6 + 0.4 + 0.2))


def test_hwmon_index_is_found_whatever_it_is(tmp_path: Path) -> None:
    hwmon_board(tmp_path, "1-0040", 7, [("VDD_IN", 5000, 1000), ("VDD_CPU_GPU_CV", 5000, 100), ("VDD_SOC", 5000, 100)])
    assert jetson.probe(tmp_path).available
    assert JetsonPowerSource(tmp_path).read().power_w == pytest.approx(5.0)


def test_probe_and_open_without_a_board(tmp_path: Path) -> None:
    availability = jetson.probe(tmp_path)
    assert availability.name == "jetson_ina3221" and not availability.available
    with pytest.raises(PowerSourceError, match="INA3221"):
        JetsonPowerSource(tmp_path)


def test_garbage_in_a_rail_file_is_reported(tmp_path: Path) -> None:
    device = iio_board(tmp_path, "6-0040", [("POM_5V_IN", 3100)])
    (device / "in_power0_input").write_text("n/a\n")
    assert not jetson.probe(tmp_path).available
    with pytest.raises(PowerSourceError, match="not an integer"):
        JetsonPowerSource(tmp_path).read()

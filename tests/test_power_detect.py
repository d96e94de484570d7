"""PowerConfig validation, available_sources and open_source over fake device trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_power_android import supply
from test_power_jetson import hwmon_board
from test_power_nvml import FakeGpu, FakeNvml
from test_power_rapl import make_zone

from hetcluster.errors import ConfigError, PowerSourceError
from hetcluster.power import (
    CombinedSource,
    EmulatedPowerSource,
    PowerConfig,
    UtilizationModelSource,
    available_sources,
    open_source,
)
from hetcluster.power.jetson import JetsonPowerSource
from hetcluster.power.rapl import RaplPowerSource

NO_NVML = FakeNvml([], init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def one_gpu() -> FakeNvml:
    return FakeNvml([FakeGpu("NVIDIA A100", "GPU-1", 40 * 2**30, 200_000, 1_000_000)])


def test_config_defaults_and_validation() -> None:
    assert PowerConfig.from_mapping({}) == PowerConfig(source="auto")
    config = PowerConfig.from_mapping({"source": "model", "idle_w": 3, "busy_w": 7.5})
    assert (config.source, config.idle_w, config.busy_w) == ("model", 3, 7.5)
    with pytest.raises(ConfigError, match="Unknown key.*wattage"):
        PowerConfig.from_mapping({"wattage": 3})
    with pytest.raises(ConfigError, match="'solar' is unknown"):
        PowerConfig.from_mapping({"source": "solar"})
    with pytest.raises(ConfigError, match="idle_w"):
        PowerConfig.from_mapping({"idle_w": -1})
    with pytest.raises(ConfigError, match="idle_w"):
        PowerConfig.from_mapping({"idle_w": "3 W"})
    with pytest.raises(ConfigError, match="above"):
        PowerConfig.from_mapping({"idle_w": 9, "busy_w": 3})
    with pytest.raises(ConfigError, match="compute_share"):
        PowerConfig.from_mapping({"compute_share": 0})
    with pytest.raises(ConfigError, match="root_pid"):
        PowerConfig.from_mapping({"root_pid": True})


def test_emulated_config_needs_watts_and_share(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="idle_w, busy_w, compute_share"):
        PowerConfig.from_mapping({"source": "emulated"})
    config = PowerConfig.from_mapping({"idle_w": 2.0, "busy_w": 6.0}).for_emulation(0.5, cgroup_dir=tmp_path)
    assert config.source == "emulated" and config.compute_share == 0.5
    (tmp_path / "cpu.stat").write_text("usage_usec 0\n")
    source = open_source(config)
    assert isinstance(source, EmulatedPowerSource) and source.name == "model" and not source.measured
    mapped = PowerConfig.from_mapping(
        {"source": "emulated", "idle_w": 2.0, "busy_w": 6.0, "compute_share": 0.5, "cgroup_dir": str(tmp_path)}
    )
    assert mapped == config


def test_available_sources_lists_every_probe(tmp_path: Path) -> None:
    found = available_sources(tmp_path, nvml_lib=NO_NVML)
    assert [a.name for a in found] == ["rapl", "nvml", "jetson_ina3221", "pi5_pmic", "android_battery", "model"]
    assert [a.available for a in found] == [False] * 5 + [True]
    assert all(a.detail for a in found)


def test_auto_combines_rapl_and_nvml(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    lib = one_gpu()
    source = open_source(PowerConfig(), tmp_path, nvml_lib=lib)
    assert isinstance(source, CombinedSource)
    assert source.name == "rapl+nvml" and source.measured
    sample = source.read()
    assert sample.energy_j is not None and sample.energy_j >= 0.0
    source.close()
    assert lib.calls[-1] == "shutdown"


def test_auto_prefers_rapl_alone_without_gpus(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    assert isinstance(open_source(PowerConfig(), tmp_path, nvml_lib=NO_NVML), RaplPowerSource)


def test_auto_picks_jetson(tmp_path: Path) -> None:
    hwmon_board(tmp_path, "1-0040", 2, [("VDD_IN", 5000, 1000), ("VDD_CPU_GPU_CV", 5000, 100), ("VDD_SOC", 5000, 100)])
    source = open_source(PowerConfig(), tmp_path, nvml_lib=NO_NVML)
    assert isinstance(source, JetsonPowerSource)
    assert source.read().power_w == pytest.approx(5.0)


def test_auto_skips_a_plugged_in_phone_but_a_named_source_does_not(tmp_path: Path) -> None:
    supply(tmp_path, "battery", kind="Battery", status="Charging", current=500_000, voltage=4_000_000)
    source = open_source(PowerConfig(idle_w=1.0, busy_w=4.0), tmp_path, nvml_lib=NO_NVML)
    assert isinstance(source, UtilizationModelSource) and (source.idle_w, source.busy_w) == (1.0, 4.0)
    named = open_source(PowerConfig(source="android_battery"), tmp_path, nvml_lib=NO_NVML)
    with pytest.raises(PowerSourceError, match="charger"):
        named.read()


def test_auto_uses_a_discharging_phone(tmp_path: Path) -> None:
    supply(tmp_path, "battery", kind="Battery", status="Discharging", current=-500_000, voltage=4_000_000)
    source = open_source(PowerConfig(), tmp_path, nvml_lib=NO_NVML)
    assert source.name == "android_battery" and source.read().power_w == pytest.approx(2.0)


def test_auto_falls_back_to_the_model(tmp_path: Path) -> None:
    source = open_source(PowerConfig(), tmp_path, nvml_lib=NO_NVML)
    assert isinstance(source, UtilizationModelSource) and not source.measured


def test_named_source_that_is_missing_says_why_and_what_exists(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    with pytest.raises(PowerSourceError) as caught:
        open_source(PowerConfig(source="jetson_ina3221"), tmp_path, nvml_lib=NO_NVML)
    message = str(caught.value)
    assert "'jetson_ina3221' is not available" in message and "INA3221" in message
    assert "rapl, model" in message


def test_named_pi5_uses_the_injected_runner(tmp_path: Path) -> None:
    model_file = tmp_path / "sys/firmware/devicetree/base/model"
    model_file.parent.mkdir(parents=True)
    model_file.write_text("Raspberry Pi 5 Model B Rev 1.0")
    recorded = (Path(__file__).parent / "data/power/pi5_pmic_read_adc.txt").read_text()
    source = open_source(PowerConfig(source="pi5_pmic"), tmp_path, nvml_lib=NO_NVML, pi5_runner=lambda argv: recorded)
    assert source.read().power_w == pytest.approx(3.7886, abs=1e-3)

"""NVML with a fake library object (this host has no NVIDIA GPU)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import nvml
from hetcluster.power.nvml import NvmlPowerSource, list_nvidia_accelerators


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str | bytes
    uuid: str | bytes
    memory_bytes: int
    power_mw: int  # nvmlDeviceGetPowerUsage
    energy_mj: int | None  # None: counter not supported (pre-Volta)
    instant_mw: int | None = None  # NVML_FI_DEV_POWER_INSTANT; None: field not supported (old driver)


@dataclass
class FieldValue:
    """pynvml's c_nvmlFieldValue_t, as far as the source reads it."""

    nvmlReturn: int
    valueType: int = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
    value: object = None


@dataclass
class Value:
    uiVal: int


@dataclass
class Memory:
    total: int


@dataclass
class FakeNvml:
    """The subset of pynvml the source uses, with pynvml's names and error codes."""

    gpus: list[FakeGpu]
    init_error: int | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = FakeNVMLError
    NVML_SUCCESS = 0
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_GPU_IS_LOST = 15

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str | bytes:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Memory:
        return Memory(handle.memory_bytes)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return handle.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        if handle.energy_mj is None:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return handle.energy_mj

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[int]) -> list[FieldValue]:
        assert field_ids == [self.NVML_FI_DEV_POWER_INSTANT]
        if handle.instant_mw is None:  # per-field status, as the real call reports it
            return [FieldValue(self.NVML_ERROR_NOT_SUPPORTED)]
        return [FieldValue(self.NVML_SUCCESS, value=Value(handle.instant_mw))]


def two_gpus(energy: bool, instant: bool = True) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("NVIDIA H100 80GB HBM3", "GPU-aaaa", 80 * 2**30, 300_000, 5_000_000 if energy else None,
                    320_000 if instant else None),
            FakeGpu(b"NVIDIA H100 80GB HBM3", b"GPU-bbbb", 80 * 2**30, 250_000, 9_000_000 if energy else None,
                    240_000 if instant else None),
        ]
    )


def test_energy_from_the_counters_since_open_and_power_from_the_instant_field() -> None:
    lib = two_gpus(energy=True)
    source = NvmlPowerSource(lib)
    assert source.has_energy_counter
    assert source.describe() == "NVML instant power and total energy counters of 2 GPU(s)"
    lib.gpus[0].energy_mj += 300_000  # 300 J
    lib.gpus[1].energy_mj += 200_000  # 200 J
    sample = source.read()
    assert sample.energy_j == pytest.approx(500.0)
    # the driver's instant reading (320 + 240 W), not the counters' delta, which moves in steps
    assert sample.power_w == pytest.approx(560.0)
    lib.gpus[0].energy_mj += 100_000
    lib.gpus[1].instant_mw = 90_000
    sample = source.read()
    assert sample.energy_j == pytest.approx(600.0)
    assert sample.power_w == pytest.approx(410.0)
    assert sample.source == "nvml" and sample.measured


def test_power_usage_when_any_gpu_lacks_the_instant_field() -> None:
    lib = two_gpus(energy=True)
    lib.gpus[1].instant_mw = None
    source = NvmlPowerSource(lib)
    assert source.describe() == "NVML power usage and total energy counters of 2 GPU(s)"
    sample = source.read()
    assert sample.power_w == pytest.approx(550.0)  # GetPowerUsage: 300 + 250 W
    assert sample.energy_j == pytest.approx(0.0)


def test_power_usage_when_the_library_has_no_field_api() -> None:
    lib = two_gpus(energy=True)
    lib.nvmlDeviceGetFieldValues = None  # an nvidia-ml-py too old to have it
    source = NvmlPowerSource(lib)
    assert source.read().power_w == pytest.approx(550.0)  # GetPowerUsage: 300 + 250 W


def test_instant_field_that_stops_answering_falls_back_to_power_usage() -> None:
    lib = two_gpus(energy=True)
    source = NvmlPowerSource(lib)
    assert source.read().power_w == pytest.approx(560.0)
    lib.gpus[0].instant_mw = None
    assert source.read().power_w == pytest.approx(550.0)  # 300 + 250 W from GetPowerUsage
    lib.gpus[0].instant_mw = 1_000_000
    assert source.read().power_w == pytest.approx(550.0)  # stays on GetPowerUsage


def test_power_only_path_when_any_gpu_lacks_a_counter() -> None:
    lib = two_gpus(energy=True, instant=False)
    lib.gpus[1].energy_mj = None
    source = NvmlPowerSource(lib)
    assert not source.has_energy_counter
    assert source.describe() == "NVML power usage of 2 GPU(s)"
    sample = source.read()
    assert sample.power_w == pytest.approx(550.0)
    assert sample.energy_j is None
    lib.gpus[0].power_mw = 100_000
    assert source.read().power_w == pytest.approx(350.0)


def test_close_shuts_nvml_down_once() -> None:
    lib = two_gpus(energy=False)
    source = NvmlPowerSource(lib)
    source.close()
    source.close()
    assert lib.calls.count("init") == 1 and lib.calls.count("shutdown") == 1


def test_nvml_errors_become_power_source_errors_with_a_fix() -> None:
    lib = FakeNvml([], init_error=FakeNvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(PowerSourceError, match="nvmlInit") as caught:
        NvmlPowerSource(lib)
    assert "/dev/nvidia" in str(caught.value)
    availability = nvml.probe(lib)
    assert not availability.available and "/dev/nvidia" in availability.detail


def test_no_gpu_is_refused_and_shut_down() -> None:
    lib = FakeNvml([])
    with pytest.raises(PowerSourceError, match="no GPU"):
        NvmlPowerSource(lib)
    assert lib.calls == ["init", "shutdown"]
    assert not nvml.probe(FakeNvml([])).available


def test_list_accelerators_decodes_bytes() -> None:
    found = list_nvidia_accelerators(two_gpus(energy=True))
    assert found == [
        {
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "index": 0,
            "uuid": "GPU-aaaa",
            "memory_bytes": 80 * 2**30,
        },
        {
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "index": 1,
            "uuid": "GPU-bbbb",
            "memory_bytes": 80 * 2**30,
        },
    ]


def test_list_accelerators_is_empty_without_nvml() -> None:
    assert list_nvidia_accelerators(FakeNvml([], init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == []
    # The real pynvml: on a GPU-less host (no libnvidia-ml.so) an empty list, never an exception.
    real = list_nvidia_accelerators()
    assert all(gpu["vendor"] == "nvidia" for gpu in real)


def test_probe_reports_gpu_count() -> None:
    availability = nvml.probe(two_gpus(energy=True))
    assert availability.available and "2 GPU" in availability.detail


REAL_NVML = nvml.probe()


@pytest.mark.skipif(not REAL_NVML.available, reason=f"no NVIDIA GPU here: {REAL_NVML.detail}")
def test_real_gpu_counter_and_listing() -> None:
    """On a host with an NVIDIA GPU (never in CI): the real library through the same code."""
    found = list_nvidia_accelerators()
    assert found and all(gpu["memory_bytes"] > 2**30 and gpu["uuid"].startswith("GPU-") for gpu in found)
    source = NvmlPowerSource()
    try:
        first = source.read()
        time.sleep(0.5)
        second = source.read()
    finally:
        source.close()
    # Volta and newer keep the total-energy counter; an idle GPU still draws tens of watts.
    assert source.has_energy_counter
    assert first.energy_j is not None and second.energy_j is not None and second.energy_j > first.energy_j
    assert 5.0 < second.power_w < 1000.0 * len(found)
    assert second.source == "nvml" and second.measured

"""NVML with a fake library object (this host has no NVIDIA GPU)."""

from __future__ import annotations

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
    power_mw: int
    energy_mj: int | None  # None: counter not supported (pre-Volta)


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


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 50.0

    def __call__(self) -> float:
        return self.now_s


def two_gpus(energy: bool) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("NVIDIA H100 80GB HBM3", "GPU-aaaa", 80 * 2**30, 300_000, 5_000_000 if energy else None),
            FakeGpu(b"NVIDIA H100 80GB HBM3", b"GPU-bbbb", 80 * 2**30, 250_000, 9_000_000 if energy else None),
        ]
    )


def test_energy_counter_path_sums_gpus_since_open() -> None:
    lib = two_gpus(energy=True)
    clock = FakeClock()
    source = NvmlPowerSource(lib, clock=clock)
    assert source.has_energy_counter
    lib.gpus[0].energy_mj += 300_000  # 300 J
    lib.gpus[1].energy_mj += 200_000  # 200 J
    clock.now_s += 1.0
    sample = source.read()
    assert sample.energy_j == pytest.approx(500.0)
    assert sample.power_w == pytest.approx(500.0)  # from the counter, not from GetPowerUsage (550 W)
    lib.gpus[0].energy_mj += 100_000
    clock.now_s += 0.5
    sample = source.read()
    assert sample.energy_j == pytest.approx(600.0)
    assert sample.power_w == pytest.approx(200.0)
    assert sample.source == "nvml" and sample.measured


def test_power_only_path_when_any_gpu_lacks_a_counter() -> None:
    lib = two_gpus(energy=True)
    lib.gpus[1].energy_mj = None
    source = NvmlPowerSource(lib)
    assert not source.has_energy_counter
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
        {"vendor": "nvidia", "name": "NVIDIA H100 80GB HBM3", "index": 0, "uuid": "GPU-aaaa", "memory_bytes": 80 * 2**30},
        {"vendor": "nvidia", "name": "NVIDIA H100 80GB HBM3", "index": 1, "uuid": "GPU-bbbb", "memory_bytes": 80 * 2**30},
    ]


def test_list_accelerators_is_empty_without_nvml() -> None:
    assert list_nvidia_accelerators(FakeNvml([], init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == []
    # The real pynvml: on a GPU-less host (no libnvidia-ml.so) an empty list, never an exception.
    real = list_nvidia_accelerators()
    assert all(gpu["vendor"] == "nvidia" for gpu in real)


def test_probe_reports_gpu_count() -> None:
    availability = nvml.probe(two_gpus(energy=True))
    assert availability.available and "2 GPU" in availability.detail

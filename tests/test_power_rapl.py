"""RAPL on fake powercap trees laid out like the kernel's (class symlinks into devices/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import rapl
from hetcluster.power.rapl import RaplPowerSource

MAX_UJ = 262_143_328_850


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def make_zone(root: Path, zone_id: str, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    """A zone directory under devices/ plus its class/powercap symlink, as sysfs shows it."""
    parts = zone_id.split(":")
    device = root / "sys/devices/virtual/powercap/intel-rapl"
    for depth in range(2, len(parts) + 1):
        device = device / ":".join(parts[:depth])
    device.mkdir(parents=True)
    (device / "name").write_text(name + "\n")
    (device / "energy_uj").write_text(f"{energy_uj}\n")
    (device / "max_energy_range_uj").write_text(f"{max_uj}\n")
    link = root / "sys/class/powercap" / zone_id
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device)
    return device


def set_energy(zone: Path, energy_uj: int) -> None:
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def server(tmp_path: Path) -> dict[str, Path]:
    """Two sockets, each package with core, uncore and dram subzones."""
    zones = {
        "pkg0": make_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000),
        "core0": make_zone(tmp_path, "intel-rapl:0:0", "core", 500_000),
        "uncore0": make_zone(tmp_path, "intel-rapl:0:1", "uncore", 100_000),
        "dram0": make_zone(tmp_path, "intel-rapl:0:2", "dram", 200_000),
        "pkg1": make_zone(tmp_path, "intel-rapl:1", "package-1", 3_000_000),
        "dram1": make_zone(tmp_path, "intel-rapl:1:0", "dram", 0),
    }
    # The MMIO interface duplicates package-0; it must never be added.
    make_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 7_000_000)
    return zones


def test_sums_packages_and_dram_but_not_core_or_uncore(tmp_path: Path, server: dict[str, Path]) -> None:
    clock = FakeClock()
    source = RaplPowerSource(tmp_path, clock=clock)
    assert sorted(source.zone_names) == ["dram", "dram", "package-0", "package-1"]

    set_energy(server["pkg0"], 1_000_000 + 50_000_000)  # +50 J
    set_energy(server["core0"], 500_000 + 40_000_000)  # inside the package: ignored
    set_energy(server["uncore0"], 100_000 + 5_000_000)  # inside the package: ignored
    set_energy(server["dram0"], 200_000 + 10_000_000)  # +10 J, a separate domain
    set_energy(server["pkg1"], 3_000_000 + 30_000_000)  # +30 J
    set_energy(server["dram1"], 8_000_000)  # +8 J
    clock.now_s += 2.0
    sample = source.read()
    assert sample.energy_j == pytest.approx(98.0)
    assert sample.power_w == pytest.approx(49.0)
    assert sample.source == "rapl" and sample.measured


def test_psys_alone_when_present(tmp_path: Path) -> None:
    pkg = make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    core = make_zone(tmp_path, "intel-rapl:0:0", "core", 0)
    psys = make_zone(tmp_path, "intel-rapl:1", "psys", 0)
    clock = FakeClock()
    source = RaplPowerSource(tmp_path, clock=clock)
    assert source.zone_names == ["psys"]
    set_energy(pkg, 6_000_000)
    set_energy(core, 4_000_000)
    set_energy(psys, 9_000_000)
    clock.now_s += 1.0
    sample = source.read()
    assert sample.energy_j == pytest.approx(9.0)
    assert sample.power_w == pytest.approx(9.0)


def test_counter_wrap_is_added_once(tmp_path: Path) -> None:
    max_uj = 10_000_000
    pkg = make_zone(tmp_path, "intel-rapl:0", "package-0", max_uj - 2_000_000, max_uj=max_uj)
    clock = FakeClock()
    source = RaplPowerSource(tmp_path, clock=clock)

    set_energy(pkg, max_uj - 500_000)  # +1.5 J
    clock.now_s += 0.5
    first = source.read()
    assert first.energy_j == pytest.approx(1.5)
    assert first.power_w == pytest.approx(3.0)

    set_energy(pkg, 1_500_000)  # wrapped: +0.5 J to the top, +1.5 J after zero
    clock.now_s += 0.5
    second = source.read()
    assert second.energy_j == pytest.approx(3.5)
    assert second.power_w == pytest.approx(4.0)

    set_energy(pkg, 2_500_000)  # ordinary increase after the wrap
    clock.now_s += 1.0
    third = source.read()
    assert third.energy_j == pytest.approx(4.5)
    assert third.power_w == pytest.approx(1.0)


def test_energy_since_open_not_since_boot(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "package-0", 123_456_789_000)
    clock = FakeClock()
    source = RaplPowerSource(tmp_path, clock=clock)
    clock.now_s += 1.0
    sample = source.read()
    assert sample.energy_j == 0.0
    assert sample.power_w == 0.0


def test_unreadable_energy_file_is_a_clear_error(tmp_path: Path) -> None:
    pkg = make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (pkg / "energy_uj").unlink()
    (pkg / "energy_uj").mkdir()  # reading a directory fails like a broken attribute
    with pytest.raises(PowerSourceError, match="energy_uj"):
        RaplPowerSource(tmp_path)
    availability = rapl.probe(tmp_path)
    assert not availability.available and "energy_uj" in availability.detail


def test_permission_denied_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    denied = pkg / "energy_uj"
    real_read_text = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        # Tests run as root, for whom chmod 000 changes nothing: deny this one path instead.
        if self.resolve() == denied.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(PowerSourceError) as caught:
        RaplPowerSource(tmp_path)
    assert "Permission denied" in str(caught.value)
    assert "udev" in str(caught.value) and "root" in str(caught.value)
    assert not rapl.probe(tmp_path).available


def test_probe_without_powercap(tmp_path: Path) -> None:
    availability = rapl.probe(tmp_path)
    assert availability.name == "rapl" and availability.measured and not availability.available
    with pytest.raises(PowerSourceError, match="No RAPL"):
        RaplPowerSource(tmp_path)


def test_probe_names_the_summed_zones(tmp_path: Path, server: dict[str, Path]) -> None:
    availability = rapl.probe(tmp_path)
    assert availability.available
    assert "package-0" in availability.detail and "dram" in availability.detail
    assert "core" not in availability.detail.replace("uncore", "")

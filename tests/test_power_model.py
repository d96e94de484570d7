"""The utilization model and the emulated-device model (real processes burning real CPU)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import model
from hetcluster.power.emulated import EmulatedPowerSource, ProcessTreeCpu, cgroup_cpu_s
from hetcluster.power.model import UtilizationModelSource, cpu_model_name, tdp_for


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 10.0

    def __call__(self) -> float:
        return self.now_s


# --- utilization model -------------------------------------------------------------------------


def test_model_maps_utilization_between_idle_and_busy() -> None:
    values = iter([0.0, 0.25, 1.0, 1.7])
    source = UtilizationModelSource(idle_w=10.0, busy_w=50.0, cpu_model="x", utilization=lambda: next(values))
    readings = [source.read() for _ in range(4)]
    assert [s.power_w for s in readings] == pytest.approx([10.0, 20.0, 50.0, 50.0])
    assert readings[1].utilization == pytest.approx(0.25)
    assert all(s.source == "model" and not s.measured and s.energy_j is None for s in readings)


def test_model_defaults_come_from_the_tdp_table() -> None:
    source = UtilizationModelSource(cpu_model="Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", utilization=lambda: 0.5)
    assert (source.idle_w, source.busy_w) == (45.0, 165.0)
    assert source.read().power_w == pytest.approx(105.0)
    configured = UtilizationModelSource(idle_w=3.0, cpu_model="Cortex-A72", utilization=lambda: 0.0)
    assert (configured.idle_w, configured.busy_w) == (3.0, 6.4)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("AMD EPYC 7B13 64-Core Processor", "EPYC"),
        ("AMD Ryzen 7 5800X 8-Core Processor", "Ryzen 7"),
        ("Intel(R) Core(TM) i7-9700K CPU @ 3.60GHz", "Core i7"),
        ("Intel(R) Xeon(R) Platinum 8480+", "Xeon Platinum"),
        ("Cortex-A76", "Cortex-A76"),
        ("Carmel", "Carmel"),
        ("Some Unknown CPU", ""),
    ],
)
def test_tdp_lookup(name: str, match: str) -> None:
    assert tdp_for(name).match == match


def test_bad_watts_are_refused() -> None:
    with pytest.raises(PowerSourceError, match="idle_w <= busy_w"):
        UtilizationModelSource(idle_w=20.0, busy_w=5.0, cpu_model="x", utilization=lambda: 0.0)


def test_cpu_model_name_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "proc/cpuinfo"
    cpuinfo.parent.mkdir(parents=True)
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n")
    assert cpu_model_name(tmp_path) == "AMD EPYC 7B13 64-Core Processor"
    # Raspberry Pi 4: no descriptive model name, the ARM part number says Cortex-A72.
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n")
    assert cpu_model_name(tmp_path) == "Cortex-A72"
    availability = model.probe(tmp_path)
    assert availability.available and not availability.measured and "Cortex-A72" in availability.detail


def test_model_with_real_psutil_stays_in_range() -> None:
    source = UtilizationModelSource(idle_w=5.0, busy_w=15.0)
    time.sleep(0.05)
    sample = source.read()
    assert 0.0 <= sample.utilization <= 1.0
    assert 5.0 <= sample.power_w <= 15.0


# --- emulated device: cgroup accounting ------------------------------------------------------


def test_emulated_from_cgroup_v2_cpu_stat(tmp_path: Path) -> None:
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 1000000\nuser_usec 800000\nsystem_usec 200000\n")
    clock = FakeClock()
    source = EmulatedPowerSource(2.0, 6.0, compute_share=0.5, cgroup_dir=tmp_path, clock=clock)
    stat.write_text("usage_usec 1100000\nuser_usec 850000\nsystem_usec 250000\n")  # 0.1 s CPU
    clock.now_s += 1.0  # in 1 s of a 0.5-core share → u = 0.2
    sample = source.read()
    assert sample.utilization == pytest.approx(0.2)
    assert sample.power_w == pytest.approx(2.0 + 4.0 * 0.2)
    assert sample.source == "model" and not sample.measured
    stat.write_text("usage_usec 3100000\n")  # 2 s of CPU in 1 s: above the share, clipped
    clock.now_s += 1.0
    assert source.read().utilization == 1.0


def test_emulated_from_cgroup_v1_cpuacct(tmp_path: Path) -> None:
    usage = tmp_path / "cpuacct.usage"
    usage.write_text("5000000000\n")
    clock = FakeClock()
    source = EmulatedPowerSource(1.0, 3.0, compute_share=2.0, cgroup_dir=tmp_path, clock=clock)
    usage.write_text(f"{5_000_000_000 + 500_000_000}\n")  # 0.5 s CPU in 0.5 s of 2 cores
    clock.now_s += 0.5
    assert source.read().utilization == pytest.approx(0.5)
    assert cgroup_cpu_s(tmp_path) == pytest.approx(5.5)


def test_emulated_cgroup_without_accounting_files(tmp_path: Path) -> None:
    with pytest.raises(PowerSourceError, match="cpu.stat"):
        EmulatedPowerSource(1.0, 3.0, compute_share=1.0, cgroup_dir=tmp_path)


def test_emulated_rejects_bad_settings() -> None:
    with pytest.raises(PowerSourceError, match="compute_share"):
        EmulatedPowerSource(1.0, 3.0, compute_share=0.0)
    with pytest.raises(PowerSourceError, match="idle_w <= busy_w"):
        EmulatedPowerSource(4.0, 3.0, compute_share=1.0)


# --- emulated device: real process trees ----------------------------------------------------

BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
# A parent that only waits, so the CPU is burnt by its child: the tree, not the root, must count.
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
    "child.wait()\n"
    "time.sleep(30)\n"
)


def spawn_parent_of_burner(burn_s: float) -> subprocess.Popen:
    script = PARENT.format(burn=BURN.format(seconds=burn_s))
    return subprocess.Popen([sys.executable, "-c", script])


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


@pytest.mark.serial   # reads a burner's CPU time against the wall clock
def test_emulated_busy_child_counts_relative_to_the_share() -> None:
    parent = spawn_parent_of_burner(1.2)
    try:
        time.sleep(0.3)  # interpreters started, the child is spinning
        small = EmulatedPowerSource(2.0, 10.0, compute_share=0.1, root_pid=parent.pid)
        large = EmulatedPowerSource(2.0, 10.0, compute_share=4.0, root_pid=parent.pid)
        time.sleep(0.5)
        small_sample, large_sample = small.read(), large.read()
        # One spinning child uses at most one core (less on a busy host, but well above 0.1):
        # against a 0.1-core share u = cores_used / 0.1 clips to 1; against 4 cores u <= 1/4.
        assert small_sample.utilization == 1.0
        assert small_sample.power_w == pytest.approx(10.0)
        assert 0.05 < large_sample.utilization <= 0.27
        assert large_sample.power_w == pytest.approx(2.0 + 8.0 * large_sample.utilization)
    finally:
        stop(parent)


def test_emulated_idle_tree_is_near_zero() -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        source = EmulatedPowerSource(2.0, 10.0, compute_share=1.0, root_pid=idle.pid)
        time.sleep(0.4)
        sample = source.read()
        assert sample.utilization < 0.05
        assert sample.power_w == pytest.approx(2.0, abs=0.4)
    finally:
        stop(idle)


@pytest.mark.serial   # reads a burner's CPU time against the wall clock
def test_exited_children_keep_their_cpu_time() -> None:
    parent = spawn_parent_of_burner(0.5)
    try:
        time.sleep(0.1)
        tree = ProcessTreeCpu(parent.pid)
        seen = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            seen.append(tree.total_s())
            if len(psutil_children(parent.pid)) == 0 and len(seen) > 3:
                break
            time.sleep(0.1)
        seen.append(tree.total_s())
        assert len(psutil_children(parent.pid)) == 0, "the burner should have exited"
        # The child burnt ~0.5 s and is gone; its last seen time is still counted and totals never drop.
        assert seen[-1] >= 0.25
        assert all(b >= a - 1e-9 for a, b in zip(seen, seen[1:]))
    finally:
        stop(parent)


def psutil_children(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def test_emulated_carries_cpu_above_the_share_into_the_next_read(tmp_path: Path) -> None:
    """A quota's period straddling two reads: 2x the share in one, nothing in the next. Clipped read
    by read the device would average u = 0.5; with the excess carried it is busy in both."""
    stat = tmp_path / "cpu.stat"
    usage_us = 1_000_000
    stat.write_text(f"usage_usec {usage_us}\n")
    clock = FakeClock()
    source = EmulatedPowerSource(0.0, 1.0, compute_share=0.3, cgroup_dir=tmp_path, clock=clock)
    reads = []
    for burst in (True, False) * 5:
        usage_us += 60_000 if burst else 0  # 0.06 s of CPU in 0.1 s of a 0.3-core share: 2x
        stat.write_text(f"usage_usec {usage_us}\n")
        clock.now_s += 0.1
        reads.append(source.read().utilization)
    assert reads == pytest.approx([1.0] * 10)
    # the carry is bounded: a long-past burst does not keep an idle device busy
    usage_us += 3_000_000
    stat.write_text(f"usage_usec {usage_us}\n")
    clock.now_s += 0.1
    assert source.read().utilization == 1.0
    clock.now_s += 1.0
    assert source.read().utilization == pytest.approx(0.06 / 0.3)  # at most 0.2 s of the share
    clock.now_s += 1.0
    assert source.read().utilization == 0.0

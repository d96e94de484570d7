"""cgroup v1 and v2 code paths on fake trees (injectable root), plus one real v1 quota as root."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from busy import BUSY_UNTIL_ORPHANED

from hetcluster.emulation.cgroups import DeviceCgroup, detect_cgroups, own_cgroup_paths, parse_mounts, remove_dirs
from hetcluster.errors import EmulationError


def _fake_v1(root: Path) -> None:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mounts").write_text(
        "proc /proc proc rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    (root / "proc/self/cgroup").write_text("4:memory:/sandbox\n2:cpu,cpuacct:/\n0::/\n")
    (root / "sys/fs/cgroup/cpu,cpuacct").mkdir(parents=True)
    (root / "sys/fs/cgroup/memory/sandbox").mkdir(parents=True)
    (root / "sys/fs/cgroup/unified").mkdir(parents=True)
    (root / "sys/fs/cgroup/unified/cgroup.controllers").write_text("")


def _fake_v2(root: Path, controllers: str = "cpu memory io") -> None:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mounts").write_text("cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    (root / "proc/self/cgroup").write_text("0::/\n")
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text(controllers + "\n")


def test_parse_mounts_and_own_paths(tmp_path):
    _fake_v1(tmp_path)
    mounts = parse_mounts((tmp_path / "proc/self/mounts").read_text(), tmp_path)
    assert [(m.version, sorted(m.controllers)) for m in mounts] == [
        ("v1", ["cpu", "cpuacct"]),
        ("v1", ["memory"]),
        ("v2", []),
    ]
    assert own_cgroup_paths("4:memory:/sandbox\n2:cpu,cpuacct:/\n0::/x\n") == {
        "memory": "/sandbox",
        "cpu": "/",
        "cpuacct": "/",
        "": "/x",
    }


def test_v1_tree_gets_quota_memory_limit_and_pids(tmp_path):
    _fake_v1(tmp_path)
    cgroups = detect_cgroups(tmp_path)
    assert cgroups is not None and cgroups.version == "v1" and cgroups.memory_enforced
    group = cgroups.create("lab", "rpi4", 0.25, 3 * 2**30)
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct/hetcluster/lab/rpi4"
    memory = tmp_path / "sys/fs/cgroup/memory/sandbox/hetcluster/lab/rpi4"  # nested under our own cgroup
    assert group.cpu_dir == cpu and group.accounting_dir == cpu and group.memory_dir == memory
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "25000"
    # The device and the parents we made get a higher weight than background processes.
    for weighted in (cpu, cpu.parent, cpu.parent.parent):
        assert (weighted / "cpu.shares").read_text() == "4096"
    assert (memory / "memory.limit_in_bytes").read_text() == str(3 * 2**30)
    group.add_pid(4242)
    assert group.pids() == {4242}
    (cpu / "cpuacct.usage").write_text("1500000000\n")
    assert group.cpu_usage_s() == pytest.approx(1.5)
    again = DeviceCgroup.from_state(group.to_state())
    assert again == group
    with pytest.raises(EmulationError, match="another emulated cluster named 'lab' is up"):
        cgroups.create("lab", "rpi4", 0.25, None)


def test_v2_tree_enables_controllers_and_writes_cpu_max(tmp_path):
    _fake_v2(tmp_path)
    cgroups = detect_cgroups(tmp_path)
    assert cgroups is not None and cgroups.version == "v2"
    group = cgroups.create("lab", "phone", 0.2, 2**30)
    base = tmp_path / "sys/fs/cgroup"
    device = base / "hetcluster/lab/phone"
    assert group.cpu_dir == device == group.memory_dir == group.accounting_dir
    assert (device / "cpu.max").read_text() == "20000 100000"
    assert (device / "cpu.weight").read_text() == "400"
    assert (device / "memory.max").read_text() == str(2**30)
    for parent in (base, base / "hetcluster", base / "hetcluster/lab"):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory", parent
    (device / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert group.cpu_usage_s() == pytest.approx(2.5)
    assert group.procs_files == [device / "cgroup.procs"]


def test_no_cpu_controller_or_no_proc_means_duty_cycle_fallback(tmp_path):
    _fake_v2(tmp_path, controllers="io pids")
    assert detect_cgroups(tmp_path) is None
    assert detect_cgroups(tmp_path / "empty") is None


def test_unwritable_tree_means_fallback(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions, so an unwritable fake tree cannot be built")
    _fake_v2(tmp_path)
    (tmp_path / "sys/fs/cgroup").chmod(0o555)
    try:
        assert detect_cgroups(tmp_path) is None
    finally:
        (tmp_path / "sys/fs/cgroup").chmod(0o755)


@pytest.mark.serial  # a CPU share or a sample rate, measured: another test beside it would bend it
@pytest.mark.root
def test_real_cgroup_quota_slows_a_busy_process():
    cgroups = detect_cgroups(Path("/"))
    if cgroups is None:
        pytest.skip("no writable cgroup with a cpu controller on this machine")
    name = f"test{os.getpid()}"
    group = cgroups.create(name, "dev", 0.2, 256 * 2**20)
    child = subprocess.Popen([sys.executable, "-c", BUSY_UNTIL_ORPHANED])
    try:
        group.add_pid(child.pid)
        assert child.pid in group.pids()
        time.sleep(0.3)
        before_s, t0 = group.cpu_usage_s(), time.monotonic()
        time.sleep(2.0)
        fraction = (group.cpu_usage_s() - before_s) / (time.monotonic() - t0)
        assert 0.1 < fraction < 0.26, fraction  # the quota is a ceiling; a loaded host may give less
    finally:
        child.kill()
        child.wait()
        left = group.remove()
        remove_dirs(group.parents)
    assert left == []
    assert not any(d.exists() for d in group.dirs)
    assert not any(d.exists() for d in group.parents if d.name == name)

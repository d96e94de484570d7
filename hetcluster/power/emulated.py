"""The power model of an emulated device (one agent process on this host pretending to be a board).

P = idle_w + (busy_w − idle_w) · u, where u is the CPU time the device's own processes consumed
since the previous read, divided by (wall time × compute_share) — the device is "fully busy" when it
uses all of the CPU the emulator grants it — and clipped to [0, 1]. CPU time above the share in one
read is carried into the next (at most ``CARRY_LIMIT_S`` of the share): the quota is enforced per
100 ms CFS period, so a read interval not aligned with the periods can see two periods' quota and
the next one less, and clipping read by read would read a busy device low
(docs/decisions.md#emulated-power-carry).

CPU time is taken from the device's cgroup when one is given (v2 ``cpu.stat`` ``usage_usec``, v1
``cpuacct.usage`` in ns), which counts every process ever in it. Otherwise it is summed over the
process tree rooted at ``root_pid`` (children included). TF server tasks come and go, so the last
seen CPU time of each process is remembered and a process that exits keeps its contribution (its
final CPU time is at most one sampling interval stale). Reported with source ``model``,
``measured=False`` and the utilization behind the value.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import psutil

from hetcluster.errors import PowerSourceError
from hetcluster.power._rate import CounterRate
from hetcluster.power._sysfs import read_optional, read_text
from hetcluster.power.base import PowerSample, PowerSource

log = logging.getLogger(__name__)

#: Wall seconds of the share that CPU time above it may carry into the next read (two CFS periods)
CARRY_LIMIT_S = 0.2


def cgroup_cpu_s(cgroup_dir: Path) -> float:
    """Total CPU seconds used by a cgroup (v2 cpu.stat usage_usec, else v1 cpuacct.usage ns)."""
    stat = read_optional(cgroup_dir / "cpu.stat")
    if stat is not None:
        for line in stat.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    if (cgroup_dir / "cpuacct.usage").exists():
        return int(read_text(cgroup_dir / "cpuacct.usage")) / 1e9
    raise PowerSourceError(
        f"{cgroup_dir} has neither cpu.stat (usage_usec) nor cpuacct.usage.",
        hint="give the device's cgroup directory (cgroup v2 or the v1 cpuacct hierarchy), or none to use its "
             "processes.",
    )


class ProcessTreeCpu:
    """CPU seconds of a process tree, keeping the time of processes that have exited."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._seen_s: dict[tuple[int, float], float] = {}  # (pid, create_time) → last CPU seconds
        self._exited_s = 0.0

    def _members(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def total_s(self) -> float:
        alive: dict[tuple[int, float], float] = {}
        for proc in self._members():
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    times = proc.cpu_times()
                alive[key] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue  # exited between listing and reading: its last seen time is kept below
        for key, cpu_s in self._seen_s.items():
            if key not in alive:
                self._exited_s += cpu_s
        self._seen_s = alive
        return self._exited_s + sum(alive.values())


class EmulatedPowerSource(PowerSource):
    """Modeled power of one emulated device from the CPU time of its own processes."""

    name = "model"
    measured = False

    def __init__(
        self,
        idle_w: float,
        busy_w: float,
        compute_share: float,
        cgroup_dir: Path | None = None,
        root_pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= idle_w <= busy_w:
            raise PowerSourceError(
                f"Emulated power needs 0 <= idle_w <= busy_w, got {idle_w} and {busy_w}.",
                hint="fix the device profile's idle_w/busy_w.",
            )
        if compute_share <= 0:
            raise PowerSourceError(
                f"compute_share must be a positive number of CPU cores, got {compute_share}.",
                hint="fix the [emulation] compute_share.",
            )
        self.idle_w = float(idle_w)
        self.busy_w = float(busy_w)
        self.compute_share = float(compute_share)
        self.cgroup_dir = Path(cgroup_dir) if cgroup_dir is not None else None
        self._tree = None if self.cgroup_dir is not None else ProcessTreeCpu(root_pid or os.getpid())
        self._rate = CounterRate(self._cpu_s(), clock)
        self._carry_cpu_s = 0.0  # CPU seconds above the share, owed to the next read

    def _cpu_s(self) -> float:
        if self.cgroup_dir is not None:
            return cgroup_cpu_s(self.cgroup_dir)
        assert self._tree is not None
        return self._tree.total_s()

    def describe(self) -> str:
        what = f"cgroup {self.cgroup_dir}" if self.cgroup_dir else f"process tree of pid {self._tree.root_pid}"  # type: ignore[union-attr]
        return (
            f"emulated device model: {self.idle_w:g}–{self.busy_w:g} W by CPU use of {what} "
            f"relative to {self.compute_share:g} core(s)"
        )

    def read(self) -> PowerSample:
        self._rate.wait_min_interval()
        cores_used = self._rate.update(self._cpu_s())
        granted_cpu_s = self.compute_share * self._rate.interval_s
        if granted_cpu_s > 0:
            used_cpu_s = max(0.0, cores_used * self._rate.interval_s) + self._carry_cpu_s
            u = min(1.0, used_cpu_s / granted_cpu_s)
            self._carry_cpu_s = min(used_cpu_s - u * granted_cpu_s, self.compute_share * CARRY_LIMIT_S)
        else:  # no time passed (a frozen clock): the previous rate, nothing carried
            u = min(1.0, max(0.0, cores_used / self.compute_share))
        return self._sample(self.idle_w + (self.busy_w - self.idle_w) * u, utilization=u)

"""CPU quota and memory limit for one emulated device, with cgroup v1 or v2, found at run time.

A device's agent and every process it starts (the TF servers) live in one cgroup per controller,
so the kernel's CFS bandwidth control slows them to `share` cores — a genuinely slower device, not
a sleep. Linux machines mount either v1 (one hierarchy per controller: `cpu.cfs_quota_us`,
`memory.limit_in_bytes`) or v2 (one unified tree: `cpu.max`, `memory.max`), sometimes both with
the controllers split between them; `detect_cgroups` reads /proc/self/mounts and /proc/self/cgroup
under an injectable root (tests build fake trees) and probes that it may actually write there.
Device cgroups sit under the caller's own cgroup at ``<base>/hetcluster/<cluster>/<device>``, so a
sandboxed caller stays inside its sandbox's limits.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from hetcluster.errors import EmulationError

log = logging.getLogger(__name__)

PERIOD_US = 100_000
# A device's quota is a ceiling, not a reservation: on a host where other work runs, a device at
# the default weight gets less than its share. A higher weight (4x an ordinary process) makes a
# busy device win its share from background load; the quotas still cap the fleet at its shares
# (docs/decisions.md#cgroup-cpu-weight).
WEIGHT_V1 = 4096  # cpu.shares, default 1024
WEIGHT_V2 = 400  # cpu.weight, default 100
TOP = "hetcluster"


@dataclass(frozen=True)
class Mount:
    path: Path  # absolute, already under the injected root
    version: str  # "v1" or "v2"
    controllers: frozenset[str]


@dataclass
class DeviceCgroup:
    """The cgroup directories of one device (one per v1 hierarchy, or one v2 directory)."""

    version: str
    cpu_dir: Path
    accounting_dir: Path
    memory_dir: Path | None
    created: list[Path] = field(default_factory=list)  # every dir made, deepest last

    @property
    def dirs(self) -> list[Path]:
        unique: list[Path] = []
        for d in (self.cpu_dir, self.accounting_dir, self.memory_dir):
            if d is not None and d not in unique:
                unique.append(d)
        return unique

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def add_pid(self, pid: int) -> None:
        for procs in self.procs_files:
            _write(procs, str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(line) for line in procs.read_text().split())
            except OSError:
                continue
        return found

    def cpu_usage_s(self) -> float:
        """CPU time used by every process that ever ran in this cgroup (seconds)."""
        if self.version == "v1":
            return int((self.accounting_dir / "cpuacct.usage").read_text().strip()) / 1e9
        for line in (self.accounting_dir / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise EmulationError(
            f"{self.accounting_dir}/cpu.stat has no usage_usec.", hint="is the cpu controller enabled?"
        )

    def to_state(self) -> dict:
        return {
            "version": self.version,
            "cpu_dir": str(self.cpu_dir),
            "accounting_dir": str(self.accounting_dir),
            "memory_dir": str(self.memory_dir) if self.memory_dir else "",
            "created": [str(p) for p in self.created],
        }

    @classmethod
    def from_state(cls, data: dict) -> "DeviceCgroup":
        return cls(
            version=data["version"],
            cpu_dir=Path(data["cpu_dir"]),
            accounting_dir=Path(data["accounting_dir"]),
            memory_dir=Path(data["memory_dir"]) if data.get("memory_dir") else None,
            created=[Path(p) for p in data.get("created", [])],
        )

    def remove(self, timeout_s: float = 5.0) -> list[Path]:
        """Rmdir every directory made, deepest first; return the device's own dirs left behind.

        Parents (hetcluster/<cluster>) shared with other devices stay until the last one goes;
        call ``remove_dirs`` on them again once every device is removed.
        """
        left = remove_dirs(self.created, timeout_s, wait_for=self.dirs)
        return [p for p in left if p in self.dirs]

    @property
    def parents(self) -> list[Path]:
        """``hetcluster/<cluster>`` and ``hetcluster`` in each hierarchy, whoever made them.

        Removing them is always attempted: rmdir of a cgroup that still has children or
        processes fails harmlessly, and another cluster may have made them before us.
        """
        found: list[Path] = []
        for directory in self.dirs:
            for parent in (directory.parent, directory.parent.parent):
                if parent not in found:
                    found.append(parent)
        return found


def remove_dirs(paths: Iterable[Path], timeout_s: float = 0.0, wait_for: Iterable[Path] = ()) -> list[Path]:
    """Rmdir cgroup directories deepest first (retrying ``wait_for`` ones up to timeout_s); return those left."""
    patient = set(wait_for)
    left: list[Path] = []
    for directory in sorted(set(paths), key=lambda p: len(p.parts), reverse=True):
        if not _rmdir(directory, timeout_s if directory in patient else 0.0):
            left.append(directory)
    return left


class Cgroups:
    """Creates device cgroups on the detected mounts (v1 hierarchies or the v2 tree)."""

    def __init__(self, cpu: Mount, cpu_base: Path, accounting: Mount, accounting_base: Path,
                 memory: Mount | None, memory_base: Path | None) -> None:
        self.cpu, self.cpu_base = cpu, cpu_base
        self.accounting, self.accounting_base = accounting, accounting_base
        self.memory, self.memory_base = memory, memory_base

    @property
    def version(self) -> str:
        return self.cpu.version

    @property
    def memory_enforced(self) -> bool:
        return self.memory is not None

    def describe(self) -> str:
        memory = f", memory at {self.memory_base}" if self.memory_base else ", memory not limited"
        return f"cgroup {self.version}: cpu at {self.cpu_base}{memory}"

    def create(self, cluster: str, device: str, share: float, memory_bytes: int | None) -> DeviceCgroup:
        """Make ``hetcluster/<cluster>/<device>`` in each hierarchy and set the limits."""
        created: list[Path] = []
        try:
            cpu_dir = self._make(self.cpu, self.cpu_base, cluster, device, created)
            quota_us = max(1000, int(round(share * PERIOD_US)))
            if self.cpu.version == "v1":
                _write(cpu_dir / "cpu.cfs_period_us", str(PERIOD_US))
                _write(cpu_dir / "cpu.cfs_quota_us", str(quota_us))
            else:
                _write(cpu_dir / "cpu.max", f"{quota_us} {PERIOD_US}")
            for made in created:  # device dirs and the parents we made, in the cpu hierarchy
                if made == cpu_dir or cpu_dir.is_relative_to(made):
                    _write(made / ("cpu.shares" if self.cpu.version == "v1" else "cpu.weight"),
                           str(WEIGHT_V1 if self.cpu.version == "v1" else WEIGHT_V2))
            accounting_dir = (
                cpu_dir if self.accounting.path == self.cpu.path
                else self._make(self.accounting, self.accounting_base, cluster, device, created)
            )
            memory_dir = None
            if self.memory is not None and self.memory_base is not None and memory_bytes:
                memory_dir = (
                    cpu_dir if self.memory.path == self.cpu.path
                    else self._make(self.memory, self.memory_base, cluster, device, created)
                )
                _write(
                    memory_dir / ("memory.limit_in_bytes" if self.memory.version == "v1" else "memory.max"),
                    str(memory_bytes),
                )
        except EmulationError:
            remove_dirs(created)
            raise
        except OSError as error:
            remove_dirs(created)
            raise EmulationError(
                f"cannot set up the cgroup of device {device!r}: {error}.",
                hint="run as root on a machine with writable cgroups, or let the duty-cycle fallback run (see "
                     "docs/emulation.md).",
            ) from None
        log.info(
            "cgroup for %s: quota %d/%d us, memory %s",
            device,
            quota_us,
            PERIOD_US,
            memory_bytes if memory_dir else "unlimited",
        )
        return DeviceCgroup(self.cpu.version, cpu_dir, accounting_dir, memory_dir, created)

    def _make(self, mount: Mount, base: Path, cluster: str, device: str, created: list[Path]) -> Path:
        path = base
        for part in (TOP, cluster, device):
            if mount.version == "v2":
                _enable_v2_controllers(path, mount.controllers & {"cpu", "memory"})
            path = path / part
            if part == device and path.is_dir():
                raise EmulationError(
                    f"cgroup {path} already exists: another emulated cluster named {cluster!r} is up.",
                    hint="take that one down, or pass a different --name.",
                )
            if not path.is_dir():
                path.mkdir()
                created.append(path)
        return path


def parse_mounts(text: str, root: Path) -> list[Mount]:
    """Cgroup mounts from /proc/self/mounts text; v2 controllers come from cgroup.controllers."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, fstype, options = fields[1], fields[2], fields[3]
        path = root / mount_point.lstrip("/")
        if fstype == "cgroup":
            controllers = frozenset(o for o in options.split(",") if o in {"cpu", "cpuacct", "memory"})
            if controllers:
                mounts.append(Mount(path, "v1", controllers))
        elif fstype == "cgroup2":
            try:
                controllers = frozenset((path / "cgroup.controllers").read_text().split())
            except OSError:
                controllers = frozenset()
            mounts.append(Mount(path, "v2", controllers))
    return mounts


def own_cgroup_paths(text: str) -> dict[str, str]:
    """From /proc/self/cgroup: controller -> our path in its v1 hierarchy; "" -> our v2 path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def detect_cgroups(root: Path = Path("/")) -> Cgroups | None:
    """A writable cgroup setup with a cpu controller, or None (the caller then duty-cycles)."""
    try:
        mounts = parse_mounts((root / "proc/self/mounts").read_text(), root)
        own = own_cgroup_paths((root / "proc/self/cgroup").read_text())
    except OSError as error:
        log.info("no cgroups: cannot read /proc/self/mounts or /proc/self/cgroup (%s)", error)
        return None

    def base(mount: Mount) -> Path:
        key = "" if mount.version == "v2" else next(c for c in ("cpu", "cpuacct", "memory") if c in mount.controllers)
        return mount.path / own.get(key, "/").lstrip("/")

    # v1 first: where a controller sits in a v1 hierarchy it is absent from v2.
    candidates: list[tuple[Mount, Mount, Mount | None]] = []
    v1 = {c: m for m in mounts if m.version == "v1" for c in m.controllers}
    if "cpu" in v1:
        candidates.append((v1["cpu"], v1.get("cpuacct", v1["cpu"]), v1.get("memory")))
    for mount in mounts:
        if mount.version == "v2" and "cpu" in mount.controllers:
            candidates.append((mount, mount, mount if "memory" in mount.controllers else None))
    for cpu, accounting, memory in candidates:
        if cpu.version == "v1" and accounting is cpu and "cpuacct" not in cpu.controllers:
            log.info("cgroup v1 cpu hierarchy %s has no cpuacct; CPU accounting unavailable there", cpu.path)
            continue
        if not _probe(cpu, base(cpu)) or (accounting is not cpu and not _probe(accounting, base(accounting))):
            continue
        memory_ok = memory if memory is not None and _probe(memory, base(memory)) else None
        if memory is not None and memory_ok is None:
            log.warning("memory cgroup %s is not writable: memory budgets are reported but not enforced", memory.path)
        found = Cgroups(cpu, base(cpu), accounting, base(accounting), memory_ok, base(memory_ok) if memory_ok else None)
        log.info("using %s", found.describe())
        return found
    log.info("no writable cgroup with a cpu controller; falling back to duty cycling")
    return None


def _probe(mount: Mount, base: Path) -> bool:
    """Whether we may create a child cgroup (and write its limit) under base; never raises.

    The probe sits directly under base, never under ``hetcluster/``: removing a ``hetcluster/``
    that a concurrent `cluster up` has just started to use would race with it.
    """
    probe = base / f".hetcluster-probe-{os.getpid()}"
    try:
        if mount.version == "v2":
            _enable_v2_controllers(base, mount.controllers & {"cpu", "memory"})
        probe.mkdir()
        try:
            name = "cpu.cfs_quota_us" if mount.version == "v1" and "cpu" in mount.controllers else None
            if mount.version == "v2" and "cpu" in mount.controllers:
                name = "cpu.max"
            if name and (probe / name).exists():
                _write(probe / name, (probe / name).read_text().strip() or "max")
        finally:
            _rmdir(probe, 0.0)
        return True
    except OSError as error:
        log.info("cgroup %s not writable: %s", base, error)
        return False


def _enable_v2_controllers(path: Path, controllers: Iterable[str]) -> None:
    """Let children of a v2 cgroup use cpu/memory (the "no internal processes" rule applies)."""
    wanted = sorted(controllers)
    if not wanted:
        return
    control = path / "cgroup.subtree_control"
    try:
        current = set(control.read_text().split())
    except OSError:
        current = set()
    missing = [c for c in wanted if c not in current]
    if missing:
        _write(control, " ".join(f"+{c}" for c in missing))


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _rmdir(path: Path, timeout_s: float) -> bool:
    """Rmdir a cgroup, retrying while exiting processes still hold it; True when gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() >= deadline:
                if error.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("cannot remove cgroup %s: %s", path, error)
                return False
            time.sleep(0.05)


__all__ = [
    "Cgroups",
    "DeviceCgroup",
    "Mount",
    "PERIOD_US",
    "detect_cgroups",
    "own_cgroup_paths",
    "parse_mounts",
    "remove_dirs",
]

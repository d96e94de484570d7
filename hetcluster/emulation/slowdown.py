"""Put a process under an emulated device's slowdown: its cgroup quota, or a duty-cycle supervisor.

An emulated device's agent starts each TF server task through ``wrapper_command`` (a shell that
writes its own PID into each of the device's cgroup.procs files and then execs the server, so no
instruction of the device's work runs unslowed and the PID stays the server's); the agent itself
runs outside the quota (docs/emulation.md: "What runs inside the quota"). Benchmarks and
experiments that must run their own code at a device's speed use ``DeviceSlowdown`` directly: the
agent never runs code sent to it.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from pathlib import Path
from typing import Sequence

from hetcluster.emulation.cgroups import Cgroups, DeviceCgroup, detect_cgroups, remove_dirs
from hetcluster.emulation.dutycycle import DutyCycler
from hetcluster.errors import EmulationError

log = logging.getLogger(__name__)


def wrapper_command(command: list[str], procs_files: Sequence[Path] = (), prefix: list[str] | None = None) -> list[str]:
    """``command`` run inside the cgroups of ``procs_files`` (joined before exec: a failed join
    fails the command) and behind ``prefix`` (e.g. nsenter)."""
    joins = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in procs_files)
    return ["/bin/sh", "-c", f'{joins}exec "$@"', "hetcluster-launch", *(prefix or []), *command]


class DeviceSlowdown:
    """One device's slowdown, for processes the caller starts itself; a context manager that cleans up.

    ``kind`` "auto" uses a cgroup where one is writable and duty cycling otherwise; "cgroup" and
    "dutycycle" force one. ``attach(pid)`` moves a running process in (its later children follow).
    """

    def __init__(self, cluster: str, device: str, share: float, memory_bytes: int | None = None,
                 kind: str = "auto", cgroup_root: Path = Path("/")) -> None:
        self.share = share
        self.cgroups: Cgroups | None = None if kind == "dutycycle" else detect_cgroups(cgroup_root)
        if kind == "cgroup" and self.cgroups is None:
            raise EmulationError(
                "no writable cgroup with a cpu controller here.", hint="use kind='auto' or 'dutycycle'."
            )
        self.group: DeviceCgroup | None = (
            self.cgroups.create(cluster, device, share, memory_bytes) if self.cgroups is not None else None
        )
        self._supervisors: list[subprocess.Popen] = []

    @property
    def kind(self) -> str:
        return f"cgroup-{self.group.version}" if self.group else "dutycycle"

    def attach(self, pid: int) -> None:
        if self.group is not None:
            self.group.add_pid(pid)
            return
        supervisor = DutyCycler().start(pid, self.share)
        if supervisor is not None:
            self._supervisors.append(supervisor)

    def close(self) -> None:
        for supervisor in self._supervisors:
            supervisor.terminate()
            try:
                supervisor.wait(timeout=5)
            except subprocess.TimeoutExpired:
                supervisor.kill()
                supervisor.wait()
        self._supervisors.clear()
        if self.group is not None:
            left = self.group.remove()
            remove_dirs(self.group.parents)  # empty hetcluster/<cluster>, hetcluster: gone too
            if left:
                log.warning("cgroups left behind (processes still inside?): %s", ", ".join(map(str, left)))
            self.group = None

    def __enter__(self) -> "DeviceSlowdown":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DeviceSlowdown", "wrapper_command"]

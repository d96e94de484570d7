"""The record of what `cluster up` made, so `cluster down` removes exactly that and nothing else.

Written (atomically) after every step of `up`, so even an `up` that dies half-way leaves a record
that `down` can clean. Processes are recorded with their start time: a PID the kernel has since
given to an unrelated process is never signalled.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from hetcluster.fileio import write_text_atomic

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
STATE_DIR_ENV = "HETCLUSTER_STATE_DIR"


def default_state_dir() -> Path:
    """``$HETCLUSTER_STATE_DIR``, else ``.hetcluster/`` under the current directory."""
    value = os.environ.get(STATE_DIR_ENV, "").strip()
    return Path(value) if value else Path.cwd() / ".hetcluster"


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> "ProcessRecord":
        return cls(pid, psutil.Process(pid).create_time())

    def process(self) -> psutil.Process | None:
        """The live process this record names, or None (gone, zombie, or a reused PID)."""
        try:
            process = psutil.Process(self.pid)
            if abs(process.create_time() - self.create_time) > 0.01 or process.status() == psutil.STATUS_ZOMBIE:
                return None
            return process
        except psutil.Error:
            return None


@dataclass
class DeviceState:
    name: str
    profile: str
    share: float
    memory_budget_bytes: int
    config_path: str
    log_path: str
    address: str = ""
    agent: ProcessRecord | None = None
    supervisor: ProcessRecord | None = None  # duty-cycle supervisor, when no cgroup
    cgroup: dict | None = None  # DeviceCgroup.to_state()


@dataclass
class ClusterState:
    name: str
    network: str
    slowdown: str
    state_dir: str
    inventory_path: str
    credentials_dir: str
    devices: list[DeviceState] = field(default_factory=list)
    shaped: dict | None = None  # ShapedNetwork.to_state()
    allow_open_plane: bool = False  # the developer switch `up` gave its agents; `add` gives it to its own

    @property
    def path(self) -> Path:
        return Path(self.state_dir) / STATE_FILE

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(asdict(self), indent=2) + "\n", mode=0o600)

    def alive_agents(self) -> int:
        return sum(1 for d in self.devices if d.agent is not None and d.agent.process() is not None)


def load_state(state_dir: Path) -> ClusterState | None:
    """The recorded cluster in state_dir, or None when nothing is up there."""
    path = Path(state_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        from hetcluster.errors import EmulationError

        raise EmulationError(
            f"cluster state {path} is unreadable: {error}.",
            hint="remove it after checking no emulated agent is still running (`ps aux | grep hetcluster`).",
        ) from None
    devices = []
    for raw in data.pop("devices", []):
        for key in ("agent", "supervisor"):
            if raw.get(key):
                raw[key] = ProcessRecord(**raw[key])
        devices.append(DeviceState(**raw))
    return ClusterState(devices=devices, **data)


__all__ = [
    "ClusterState",
    "DeviceState",
    "ProcessRecord",
    "STATE_DIR_ENV",
    "STATE_FILE",
    "default_state_dir",
    "load_state",
]

"""Watch a fleet while a job trains: which devices leave and which join.

A device *leaves* when its agent stops answering its health check (``misses`` polls in a row) or
when it is taken out of the inventory file; it *joins* when it is added to the inventory file or
its agent, down until then, answers again. ``FleetWatcher.poll`` re-reads the inventory only
when the file changed, asks every listed agent for its health (``check_agents``: a device on a
dead host costs its timeout) and returns what changed since the last poll, in inventory order.
`hetcluster train --elastic` polls it from a thread of its own.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from hetcluster.errors import HetclusterError

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory

log = logging.getLogger(__name__)

# check(inventory, names, timeout_s) -> {name: reason} for the agents that do not answer (coordinator.check_agents)
HealthCheck = Callable[["Inventory", Sequence[str], float], dict]


@dataclass(frozen=True)
class FleetChange:
    """A device that left (``kind`` "left") or joined ("joined"), why, and when (wall clock)."""

    kind: str
    device: str
    reason: str
    wall_s: float

    def to_dict(self) -> dict:
        return {"kind": self.kind, "device": self.device, "reason": self.reason, "wall_s": self.wall_s}


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


class FleetWatcher:
    """The fleet as the inventory file lists it and as its agents answer, polled.

    ``fleet`` is the inventory the job started from (``fleet.path`` is the file watched), and
    ``up`` the devices known to answer then; the first poll reports every other listed device that
    answers as joined."""

    def __init__(self, fleet: Inventory, up: Sequence[str], *, check: HealthCheck | None = None,
                 timeout_s: float = 2.0, misses: int = 2) -> None:
        from hetcluster.training.coordinator import check_agents

        self.fleet = fleet
        self.up = [n for n in fleet.names if n in set(up)]
        self._check = check or (lambda inventory, names, timeout: check_agents(inventory, names, timeout))
        self._timeout_s = timeout_s
        self._path = Path(fleet.path) if fleet.path is not None else None
        self._mtime = _mtime_ns(self._path) if self._path is not None else -1
        self._unreadable = False
        # a device leaves after this many failed checks in a row: one slow answer on a busy host is no departure
        self._misses, self._missed = max(1, misses), {}

    def _reread(self) -> None:
        """Take the inventory file again when it changed; an unreadable one keeps the last (a
        warning, once), as does one being written (write_inventory replaces it atomically)."""
        from hetcluster.inventory import load_inventory

        if self._path is None:
            return
        mtime = _mtime_ns(self._path)
        if mtime == self._mtime:
            return
        try:
            fleet = load_inventory(self._path)
        except HetclusterError as error:
            if not self._unreadable:
                log.warning("the inventory %s cannot be read now (%s); watching the fleet it listed before",
                            self._path, error)
            self._unreadable = True
            return
        self._mtime, self._unreadable = mtime, False
        if fleet.parameter_server_host != self.fleet.parameter_server_host:
            log.warning("the inventory now names parameter_server_host %s; this job keeps %s",
                        fleet.parameter_server_host, self.fleet.parameter_server_host)
            return
        self.fleet = fleet

    def poll(self) -> list[FleetChange]:
        """What changed since the last poll: devices that left, then devices that joined."""
        before, listed_before = list(self.up), set(self.fleet.names)
        self._reread()
        listed = self.fleet.names
        failed = self._check(self.fleet, listed, self._timeout_s) if listed else {}
        self._missed = {name: self._missed.get(name, 0) + 1 for name in failed}
        down = {name: reason for name, reason in failed.items()
                if name not in before or self._missed[name] >= self._misses}
        now = time.time()
        changes = [FleetChange("left", name, "taken out of the inventory", now)
                   for name in before if name not in listed]
        changes += [FleetChange("left", name, down[name], now) for name in before if name in listed and name in down]
        self.up = [name for name in listed if name not in down]
        changes += [FleetChange("joined", name, "its agent answers again" if name in listed_before
                                else "added to the inventory", now)
                    for name in self.up if name not in before]
        for change in changes:
            log.info("device %s %s: %s", change.device, change.kind, change.reason)
        return changes

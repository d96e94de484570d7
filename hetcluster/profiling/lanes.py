"""Which devices pre-training measures alone at the same time (pure).

A *lane* is one parameter server and one chief of the phase's servers: solo runs on different
lanes share no TF server, so devices that are separate machines can be measured alone all at
once. Devices of the emulated fleet are not separate machines: they share this host's cores
with each other and with every lane's training process and parameter server. Measuring them at
once is faithful only while all of that fits the host, so they are packed into groups that fit,
measured one group after the other; the phase says so when there is more than one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# a lane's training process and PS take up to as much of the host again as its emulated device's
# share (docs/decisions.md#lane-host-cost)
HOST_COST_PER_SHARE = 2.0
# a real device's lane costs the coordinator host its training process and PS: half a core at most
# (docs/decisions.md#lane-host-cost)
REMOTE_LANE_CORES = 0.5
# the share of a job pre-training may take, its steps and its seconds (docs/decisions.md#pretrain-budget)
DEFAULT_BUDGET_SHARE = 1 / 3


@dataclass(frozen=True)
class LaneDevice:
    """A device to measure alone: its emulated compute share (cores of this host; 0 for a machine
    of its own)."""

    name: str
    compute_share: float = 0.0

    @property
    def host_cores(self) -> float:
        """Cores of the coordinator's host its solo run takes."""
        if self.compute_share > 0:
            return HOST_COST_PER_SHARE * self.compute_share
        return REMOTE_LANE_CORES


def solo_groups(devices: Sequence[LaneDevice], host_cores: float) -> list[list[str]]:
    """The devices in groups measured at once, first-fit by decreasing cost: a group's cost never
    exceeds ``host_cores`` unless one device alone does (it is then a group of its own). The
    costliest (fastest) device comes first: its worker is the first to be ready."""
    groups: list[list[LaneDevice]] = []
    for device in sorted(devices, key=lambda d: -d.host_cores):
        for group in groups:
            if sum(d.host_cores for d in group) + device.host_cores <= host_cores + 1e-9:
                group.append(device)
                break
        else:
            groups.append([device])
    return [[d.name for d in group] for group in groups]


def grouping_line(groups: Sequence[Sequence[str]], devices: Sequence[LaneDevice], host_cores: float) -> str:
    """One line saying how the solo runs are grouped, and why when not all at once."""
    if len(groups) <= 1:
        return "alone at once: " + ", ".join(groups[0]) if groups else "no device to measure"
    cost = {d.name: d.host_cores for d in devices}
    shown = "; then ".join("+".join(g) + f" ({sum(cost[n] for n in g):.2f} cores)" for g in groups)
    return (f"alone in {len(groups)} groups, one after the other: {shown} — emulated devices share this host's "
            f"{host_cores:g} cores with their runs' training processes and parameter servers")

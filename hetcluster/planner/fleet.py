"""The units of the search: single devices, or classes of identical devices.

Every model quantity is per unit (effective solo throughput, busy and idle power, memory fit), and
a configuration is a weight vector over units (0/1 for devices, counts for classes). Grouping is
the only difference between exact enumeration and class aggregation, so both share one model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from hetcluster.planner.inputs import DeviceMeasurement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Units:
    """Per-unit arrays (length u) and the device names each unit stands for."""

    labels: tuple[str, ...]                 # unit name: device name, or class key
    members: tuple[tuple[str, ...], ...]    # concrete device names per unit, in pick order
    rate_steps_per_s: np.ndarray            # effective solo throughput r_i / memory_slowdown_i
    rate_std_steps_per_s: np.ndarray        # spread of that throughput
    busy_power_w: np.ndarray
    idle_power_w: np.ndarray
    memory_fits: np.ndarray                 # bool
    is_classes: bool
    outside_idle_w: float = 0.0             # idle power of fleet devices left out of the units
                                            # (excluded ones), counted when idle power counts
    startup_s: np.ndarray | None = None     # steady-line intercept of a run alone (None: all 0)
    first_step_s: np.ndarray | None = None  # run start → first completed step (None: all 0)
    startup_power_w: np.ndarray | None = None  # mean power over the start-up (0/None: not measured)
    memory_slowdown: np.ndarray | None = None  # step-time multiplier of each unit's own memory plan,
                                               # which it trains under in every configuration
                                               # (already divided out of rate_steps_per_s; None: all 1)

    @property
    def has_startup(self) -> bool:
        return self.startup_s is not None and bool(np.any(self.startup_s > 0) or np.any(self.first_step_s > 0))

    def measured_startup(self) -> tuple[np.ndarray, np.ndarray]:
        """(startup_s, startup_power_w) of the units whose start-up power was measured, 0 for the
        others (their start-up stays priced at their training power)."""
        if self.startup_s is None or self.startup_power_w is None:
            return np.zeros(self.size), np.zeros(self.size)
        return np.where(self.startup_power_w > 0, self.startup_s, 0.0), self.startup_power_w

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(m) for m in self.members], dtype=np.int64)

    @property
    def size(self) -> int:
        return len(self.labels)


def device_units(devices: tuple[DeviceMeasurement, ...]) -> Units:
    """One unit per device, in the given order (bit i of a mask = devices[i])."""
    return Units(
        labels=tuple(d.name for d in devices),
        members=tuple((d.name,) for d in devices),
        rate_steps_per_s=np.array([d.steps_per_s / d.memory_slowdown for d in devices], dtype=np.float64),
        rate_std_steps_per_s=np.array([d.steps_per_s_std / d.memory_slowdown for d in devices], dtype=np.float64),
        busy_power_w=np.array([d.busy_power_w for d in devices], dtype=np.float64),
        idle_power_w=np.array([d.idle_power_w for d in devices], dtype=np.float64),
        memory_fits=np.array([bool(d.memory_fits) for d in devices]),
        is_classes=False,
        startup_s=np.array([d.startup_s for d in devices], dtype=np.float64),
        first_step_s=np.array([d.first_step_s for d in devices], dtype=np.float64),
        startup_power_w=np.array([d.startup_power_w for d in devices], dtype=np.float64),
        memory_slowdown=np.array([d.memory_slowdown for d in devices], dtype=np.float64),
    )


def class_units(devices: tuple[DeviceMeasurement, ...], first: tuple[str, ...] = ()) -> Units:
    """Group devices with the same (class_key, memory plan) into one unit with averaged measurements.

    A device without a class_key is its own class. Within a class, devices named in `first`
    (e.g. required devices) are picked before the others, so a count of k picks them first.
    """
    groups: dict[tuple, list[DeviceMeasurement]] = {}
    for d in devices:
        key = (
            d.class_key if d.class_key is not None else f"device:{d.name}",
            bool(d.memory_fits),
            float(d.memory_slowdown),
        )
        groups.setdefault(key, []).append(d)
    labels, members, rate, rate_std, busy, idle, fits, startup, first, startup_power = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    used_labels: set[str] = set()
    for key, group in groups.items():
        group = sorted(group, key=lambda d: (d.name not in first,))  # stable: required first
        label = group[0].name if key[0].startswith("device:") else str(key[0])
        if label in used_labels:  # same class key split by memory plan
            label = f"{label}[{len(used_labels)}]"
        used_labels.add(label)
        rates = np.array([d.steps_per_s for d in group])
        if rates.size > 1 and rates.std() > 0.05 * rates.mean():
            log.warning(
                "class %s: member throughputs differ by %.0f%%; using their mean",
                label,
                100 * rates.std() / rates.mean(),
            )
        labels.append(label)
        members.append(tuple(d.name for d in group))
        rate.append(rates.mean() / key[2])
        spread = np.sqrt(np.mean([d.steps_per_s_std ** 2 for d in group]) + (rates.var() if rates.size > 1 else 0.0))
        rate_std.append(spread / key[2])
        busy.append(float(np.mean([d.busy_power_w for d in group])))
        idle.append(float(np.mean([d.idle_power_w for d in group])))
        fits.append(key[1])
        startup.append(float(np.mean([d.startup_s for d in group])))
        first.append(float(np.mean([d.first_step_s for d in group])))
        startup_power.append(_mean_startup_power_w(group))
    return Units(
        labels=tuple(labels),
        members=tuple(members),
        rate_steps_per_s=np.array(rate, dtype=np.float64),
        rate_std_steps_per_s=np.array(rate_std, dtype=np.float64),
        busy_power_w=np.array(busy, dtype=np.float64),
        idle_power_w=np.array(idle, dtype=np.float64),
        memory_fits=np.array(fits, dtype=bool),
        is_classes=True,
        startup_s=np.array(startup, dtype=np.float64),
        first_step_s=np.array(first, dtype=np.float64),
        startup_power_w=np.array(startup_power, dtype=np.float64),
        memory_slowdown=np.array([key[2] for key in groups], dtype=np.float64),
    )


def _mean_startup_power_w(group) -> float:
    """Mean start-up power of the devices that measured one (0, not measured, when none did)."""
    measured = [d.startup_power_w for d in group if d.startup_power_w > 0]
    return float(np.mean(measured)) if measured else 0.0


def run_weights(units: Units, device_sets: list[tuple[str, ...]]) -> np.ndarray:
    """Weight vectors (runs × units) of measured runs, whatever the grouping."""
    where = {name: u for u, names in enumerate(units.members) for name in names}
    out = np.zeros((len(device_sets), units.size), dtype=np.float64)
    for row, names in enumerate(device_sets):
        for name in names:
            out[row, where[name]] += 1.0
    return out

"""Which multi-device sets pre-training measures, besides every device alone.

The planner's analytic model sums solo throughputs; the sets calibrate how far reality falls short
(parameter-server and link contention), so they should span the range of configurations: the
whole fleet (most contention), the two fastest devices (contention between strong workers), and
all but the fastest (contention without the dominant worker); then the fastest with the slowest.
That order chose best on the planner's accuracy benchmark (docs/decisions.md#calibration-sets).
With classes of identical devices (``class_of``), two sets with as many members of each class are
the same measurement (server+rpi4-1 and server+rpi4-6), so only the first is kept.
Pure: names and numbers in, tuples of names out.
"""

from __future__ import annotations

from typing import Mapping


def class_unit(name: str, device_class: str | None) -> str:
    """What a device counts as among identical devices: its class, or itself when it has none
    (the planner's class_units groups by the same rule)."""
    return device_class or f"device:{name}"


def calibration_sets(solo_steps_per_s: dict[str, float], max_sets: int = 3,
                     class_of: Mapping[str, str | None] | None = None) -> list[tuple[str, ...]]:
    """Up to ``max_sets`` distinct sets of ≥2 devices, in the order above; names fastest first."""
    ranked = sorted(solo_steps_per_s, key=lambda name: (-solo_steps_per_s[name], name))
    if len(ranked) < 2 or max_sets <= 0:
        return []
    candidates = [tuple(ranked), tuple(ranked[:2]), tuple(ranked[1:]), (ranked[0], ranked[-1])]
    classes = class_of or {}

    def composition(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(class_unit(n, classes.get(n)) for n in names))

    chosen: list[tuple[str, ...]] = []
    for candidate in candidates:
        if len(set(candidate)) == len(candidate) >= 2 and composition(candidate) not in map(composition, chosen):
            chosen.append(candidate)
    return chosen[:max_sets]

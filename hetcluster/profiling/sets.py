"""Which multi-device sets pre-training measures, besides every device alone.

The planner's analytic model sums solo throughputs; the sets calibrate how far reality falls short
(parameter-server and link contention), so they should span the range of configurations: the
whole fleet (most contention), the two fastest devices (contention between strong workers), and
the fastest with the slowest (a mixed pair). Pure: names and numbers in, tuples of names out.
"""

from __future__ import annotations


def calibration_sets(solo_steps_per_s: dict[str, float], max_sets: int = 3) -> list[tuple[str, ...]]:
    """Up to ``max_sets`` distinct sets of ≥2 devices, in the order above; names fastest first."""
    ranked = sorted(solo_steps_per_s, key=lambda name: (-solo_steps_per_s[name], name))
    if len(ranked) < 2 or max_sets <= 0:
        return []
    candidates = [tuple(ranked), tuple(ranked[:2]), (ranked[0], ranked[-1])]
    if len(ranked) >= 4:
        candidates.append(tuple(ranked[: (len(ranked) + 1) // 2]))  # the faster half
    chosen: list[tuple[str, ...]] = []
    for candidate in candidates:
        if candidate not in chosen and len(set(candidate)) == len(candidate) >= 2:
            chosen.append(candidate)
    return chosen[:max_sets]

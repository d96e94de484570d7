"""Objectives as objects: each names the column it minimises and the column of its uncertainty."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetcluster.errors import PlanningError


@dataclass(frozen=True)
class Objective:
    """Minimise `column`. Predictions equal to 1e-9 (e.g. every set past a hard capacity) tie;
    ties go to the most uncontended throughput Σ r_i for `time` (the most headroom if the
    capacity was underestimated), to fewer workers for the others, then to less energy."""

    name: str
    column: str
    std_column: str
    unit: str

    def values(self, table: pd.DataFrame) -> np.ndarray:
        return table[self.column].to_numpy(dtype=np.float64)

    def order(self, table: pd.DataFrame, resolve_top: int = 5000) -> np.ndarray:
        """Row positions, best first. Ties are resolved within the tie groups that reach the first
        `resolve_top` positions (that is where the choice and the shown rows are), at most
        `resolve_top` rows of each, so a capacity plateau of 10^5 rows costs no full lexsort."""
        values = self.values(table)
        order = np.argsort(values)  # quicksort: 3× faster than stable; ties are resolved below
        if values.size < 2:
            return order
        ranked = values[order]
        # a new tie group starts where the next value is more than 1e-9 (relative) larger
        gap = ranked[1:] - ranked[:-1] > 1e-9 * np.abs(ranked[1:])
        starts = np.flatnonzero(np.concatenate([[True], gap]))
        ends = np.append(starts[1:], ranked.size)
        if self.name == "time" and "demand_steps_per_s" in table.columns:
            tie = -table["demand_steps_per_s"].to_numpy(dtype=np.float64)
        else:
            tie = table["n_workers"].to_numpy().astype(np.float64)
        energy = table["energy_j"].to_numpy(dtype=np.float64)
        for start, end in zip(starts, ends):
            if start >= resolve_top:
                break
            if end - start < 2:
                continue
            group = order[start:end]
            if group.size > resolve_top:  # only the best resolve_top of a huge plateau are sorted
                best = np.argpartition(tie[group], resolve_top)[:resolve_top]
                rest = np.setdiff1d(np.arange(group.size), best, assume_unique=True)
                group = np.concatenate([group[best], group[rest]])
                head = group[:resolve_top]
                group[:resolve_top] = head[np.lexsort((energy[head], tie[head]))]
            else:
                group = group[np.lexsort((energy[group], tie[group]))]
            order[start:end] = group
        return order


Time = Objective("time", "time_s", "time_s_std", "s")
Power = Objective("power", "power_w", "power_w_std", "W")
Energy = Objective("energy", "energy_j", "energy_j_std", "J")
EDP = Objective("edp", "edp_js", "edp_js_std", "J·s")

OBJECTIVES = {o.name: o for o in (Time, Power, Energy, EDP)}


def get_objective(name: str | Objective) -> Objective:
    """`time`, `power`, `energy` or `edp` (case-insensitive) → the Objective."""
    if isinstance(name, Objective):
        return name
    key = str(name).strip().lower()
    if key not in OBJECTIVES:
        raise PlanningError(f"Unknown objective {name!r}.", hint=f"use one of: {', '.join(OBJECTIVES)}.")
    return OBJECTIVES[key]

"""Solve: apply constraints to the estimate table, pick the best row, explain infeasibility.

The table is never recomputed here; choosing is a pure function of (table, objective,
constraints), so estimation and choice can be tested apart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from hetcluster.errors import InfeasibleError
from hetcluster.planner.constraints import Constraint, MemoryFit
from hetcluster.planner.objectives import Objective, get_objective

log = logging.getLogger(__name__)

NEAR_TIES_SHOWN = 5


class SoloRate(NamedTuple):
    """A device's solo rate as its pre-training window measured it and as the planner used it:
    revised by what the calibration sets measured of the device (planner/solo_rates.py)."""

    device: str
    window_steps_per_s: float
    used_steps_per_s: float


@dataclass(frozen=True)
class Plan:
    """The choice: device names, the table (sorted by the objective, with feasible/chosen), and
    each device's solo rate (planner.plan() fills it; choose() alone knows no rates)."""

    chosen: tuple[str, ...]
    objective: Objective
    table: pd.DataFrame
    constraints: tuple[Constraint, ...]
    solo_rates: tuple[SoloRate, ...] = ()

    @property
    def chosen_row(self) -> pd.Series:
        return self.table.loc[self.table["chosen"]].iloc[0]

    def near_ties(self, limit: int = NEAR_TIES_SHOWN) -> pd.DataFrame:
        """Feasible configurations other than the chosen one whose predicted objective lies within
        the chosen prediction's own uncertainty (one σ), best first, at most ``limit``, with their
        ``relative_difference`` from the chosen value. Non-empty: by the planner's own reckoning
        pre-training cannot tell these apart from the choice: the measured best of a near-tie
        changes from one training to the next (docs/experiments.md#near-ties)."""
        row = self.chosen_row
        column, value = self.objective.column, float(row[self.objective.column])
        spread = float(row[self.objective.std_column])
        table = self.table
        within = (table["feasible"].to_numpy() & ~table["chosen"].to_numpy()
                  & (table[column].to_numpy() <= value + spread))
        ties = table.iloc[np.flatnonzero(within)[:limit]].copy()   # the table is best first
        ties["relative_difference"] = ties[column] / value - 1.0 if value > 0 else np.nan
        return ties


def _with_memory_fit(constraints) -> tuple[Constraint, ...]:
    constraints = tuple(constraints or ())
    if not any(isinstance(c, MemoryFit) for c in constraints):
        constraints = (MemoryFit(),) + constraints
    return constraints


def _cost(row: pd.Series) -> str:
    return (
        f"{'+'.join(row['devices'])}: time {row['time_s']:.4g} s, power {row['power_w']:.4g} W, "
        f"energy {row['energy_j']:.4g} J, EDP {row['edp_js']:.4g} J·s"
    )


def infeasible_error(table: pd.DataFrame, objective: Objective, constraints: tuple[Constraint, ...]) -> InfeasibleError:
    """Name the failing constraint and what the nearest feasible configuration would cost."""
    masks = [c.mask(table) for c in constraints]
    order = objective.order(table)
    for i, c in enumerate(constraints):
        others = (
            np.logical_and.reduce([m for j, m in enumerate(masks) if j != i])
            if len(masks) > 1
            else np.ones(len(table), bool)
        )
        if others.any() and not isinstance(c, MemoryFit):
            best = order[others[order]][0]
            violation = np.where(others, c.violation(table), np.inf)
            nearest = int(np.lexsort((objective.values(table), violation))[0])
            return InfeasibleError(
                f"No configuration satisfies the {c.describe()}. The nearest is {_cost(table.iloc[nearest])}; "
                f"ignoring the constraint, the best by {objective.name} is {_cost(table.iloc[best])}.",
                hint=f"relax or drop {c.flag}.",
            )
    violation = np.sum([c.violation(table) for c in constraints], axis=0)
    best = int(np.lexsort((objective.values(table), violation))[0])
    row = table.iloc[best]
    failing = [c.describe() for c, m in zip(constraints, masks) if not m[best]]
    return InfeasibleError(
        f"No configuration satisfies the constraints together; the least-violating one, {_cost(row)}, "
        f"still fails: {'; '.join(failing)}.",
        hint="relax several constraints (deadline, power cap, energy budget, required/excluded devices).",
    )


def choose(table: pd.DataFrame, objective, constraints=()) -> Plan:
    """Best feasible configuration by `objective`; raises InfeasibleError when there is none."""
    objective = get_objective(objective)
    constraints = _with_memory_fit(constraints)
    feasible = np.logical_and.reduce([c.mask(table) for c in constraints])
    if not feasible.any():
        raise infeasible_error(table, objective, constraints)
    order = objective.order(table)
    order = np.concatenate([order[feasible[order]], order[~feasible[order]]])
    out = table.iloc[order].reset_index(drop=True)
    out["feasible"] = feasible[order]
    chosen = np.zeros(len(out), dtype=bool)
    chosen[0] = True
    out["chosen"] = chosen
    picked = tuple(out["devices"].iloc[0])
    log.info(
        "chose %s by %s (%d of %d configurations feasible)",
        "+".join(picked),
        objective.name,
        int(feasible.sum()),
        len(table),
    )
    return Plan(chosen=picked, objective=objective, table=out, constraints=constraints)


def pareto_front(table: pd.DataFrame, among: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of configurations not dominated in (time_s, energy_j) (both minimised)."""
    time_s = table["time_s"].to_numpy(dtype=np.float64)
    energy_j = table["energy_j"].to_numpy(dtype=np.float64)
    candidates = np.ones(len(table), bool) if among is None else np.asarray(among, bool)
    index = np.flatnonzero(candidates)
    order = index[np.lexsort((energy_j[index], time_s[index]))]
    front = np.zeros(len(table), dtype=bool)
    e_sorted = energy_j[order]
    prev_best = np.minimum.accumulate(np.concatenate([[np.inf], e_sorted[:-1]]))
    front[order[e_sorted < prev_best]] = True
    return front

"""plan(): estimate → solve for a whole fleet, exact where possible, searched where not.

Up to 20 devices (or when forced) every subset is enumerated. Larger fleets are grouped into
classes of identical devices; when the Π(c_k+1)−1 count vectors still fit in a table they are all
enumerated, otherwise (e.g. 1000 devices in 12 classes) a pattern search over count vectors runs:

  1. starts: every class alone at full count, all devices, and greedy prefixes of the classes
     ordered by energy per step (the shape energy-optimal sets take), by speed and by power;
     the six best starts are searched from;
  2. from the best starts, moves k_c ± δ_c and pairwise exchanges (+δ on one class, −δ on
     another) are evaluated in one vectorised batch; the best improving move is taken until none
     improves, then δ is halved down to one device;
  3. a final exact line search over each class's count (0..c_k) with the others fixed.

Moves are ranked by (total constraint violation, objective), so the search walks towards
feasibility first. `--require`/`--exclude` become count bounds (required devices are picked first
inside their class; excluded devices are dropped before grouping). Brute-force oracle tests
check the search and the class enumeration against exhaustive device enumeration.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pandas as pd

from hetcluster.planner.choose import Plan, SoloRate, choose
from hetcluster.planner.configurations import class_configurations, count_class_configurations
from hetcluster.planner.constraints import Constraint, Exclude, Require
from hetcluster.planner.estimate import MAX_TABLE_ROWS, FittedModels, estimate, evaluate, resolve_mode, table_from
from hetcluster.planner.fleet import Units, class_units
from hetcluster.planner.inputs import JobSpec
from hetcluster.planner.objectives import Objective, get_objective

log = logging.getLogger(__name__)


def plan(
    devices,
    runs,
    job: JobSpec,
    objective: str | Objective = "time",
    constraints=(),
    *,
    mode: str = "auto",
    models: FittedModels | None = None,
    max_table_rows: int = MAX_TABLE_ROWS,
    search: bool | None = None,
) -> Plan:
    """Fit, estimate and choose. search: None = only when enumeration is too large; True forces
    the count-vector search (class mode), False forbids it. The plan carries each device's solo
    rate as its window measured it and as the models used it (Plan.solo_rates)."""
    devices, runs = tuple(devices), tuple(runs)
    models = models or FittedModels.fit(devices, runs, job)
    chosen = _choose(devices, runs, get_objective(objective), tuple(constraints), models, mode, max_table_rows, search)
    used = {d.name: d.steps_per_s for d in models.throughput.devices}
    return replace(chosen, solo_rates=tuple(SoloRate(d.name, d.steps_per_s, used.get(d.name, d.steps_per_s))
                                            for d in devices))


def _choose(devices, runs, objective: Objective, constraints, models: FittedModels, mode: str, max_table_rows: int,
            search: bool | None) -> Plan:
    classes = resolve_mode(devices, mode) or bool(search)
    required = tuple(n for c in constraints if isinstance(c, Require) for n in c.names)
    if not classes:
        return choose(estimate(devices, runs, models.job, mode="devices", models=models), objective, constraints)
    excluded = {n for c in constraints if isinstance(c, Exclude) for n in c.names}
    _check_names(devices, required + tuple(excluded))
    kept = tuple(d for d in devices if d.name not in excluded)
    units = replace(class_units(kept, first=required),
                    outside_idle_w=float(sum(d.idle_power_w for d in devices if d.name in excluded)))
    total = count_class_configurations(units.counts)
    if not search and total <= max_table_rows:
        configs = class_configurations(units.counts)
        table = table_from(units, configs, evaluate(models, units, configs))
        table.attrs["device_names"] = tuple(d.name for d in devices)
        return choose(table, objective, constraints)
    if search is False:
        from hetcluster.errors import PlanningError

        raise PlanningError(
            f"{total} class configurations exceed the table limit of {max_table_rows}.", hint="allow the search."
        )
    configs = search_counts(models, units, objective, constraints, required)
    table = table_from(units, configs, evaluate(models, units, configs))
    table.attrs["device_names"] = tuple(d.name for d in devices)
    table.attrs["search"] = "pattern"
    table.attrs["configurations_total"] = total
    return choose(table, objective, constraints)


def _check_names(devices, names) -> None:
    known = {d.name for d in devices}
    unknown = [n for n in names if n not in known]
    if unknown:
        from hetcluster.errors import PlanningError

        raise PlanningError(
            f"Unknown device(s): {', '.join(unknown)}.", hint=f"use names from the fleet: {', '.join(sorted(known))}."
        )


class _Scorer:
    """Evaluate count vectors and rank them by (violation, objective); remembers what it saw."""

    def __init__(self, models: FittedModels, units: Units, objective: Objective, constraints: tuple[Constraint, ...]):
        self.models, self.units, self.objective = models, units, objective
        self.numeric = tuple(c for c in constraints if not isinstance(c, (Require, Exclude)))
        self.seen: dict[bytes, tuple[float, float]] = {}

    def score(self, counts: np.ndarray) -> np.ndarray:
        """(rows × 2) array of (violation, objective value)."""
        counts = np.atleast_2d(counts).astype(np.int64)
        frame = pd.DataFrame(evaluate(self.models, self.units, counts))
        violation = np.zeros(len(frame))
        for c in self.numeric:
            violation += c.violation(frame)
        values = self.objective.values(frame)
        for row, v, o in zip(counts, violation, values):
            self.seen[row.tobytes()] = (float(v), float(o))
        return np.column_stack([violation, values])


def _best(scores: np.ndarray) -> int:
    return int(np.lexsort((scores[:, 1], scores[:, 0]))[0])


def _better(a: np.ndarray, b: np.ndarray) -> bool:
    return (a[0], a[1]) < (b[0] - 1e-12, b[1]) or (abs(a[0] - b[0]) <= 1e-12 and a[1] < b[1] * (1 - 1e-12))


def search_counts(models, units: Units, objective: Objective, constraints, required=(), starts: int = 6) -> np.ndarray:
    """Pattern search over count vectors; returns every distinct vector it evaluated."""
    m = units.size
    upper = np.where(units.memory_fits, units.counts, 0).astype(np.int64)
    lower = np.array([sum(n in required for n in members) for members in units.members], dtype=np.int64)
    lower = np.minimum(lower, upper)
    scorer = _Scorer(models, units, objective, tuple(constraints))

    def clip(k: np.ndarray) -> np.ndarray:
        k = np.clip(k, lower, upper)
        empty = k.sum(axis=-1) == 0
        if np.any(empty):  # a configuration needs one worker: add the fastest allowed class
            fastest = int(np.argmax(np.where(upper > 0, units.rate_steps_per_s, -np.inf)))
            k = k.copy()
            k[empty, fastest] = 1
        return k

    seeds = [upper.copy()]
    for c in range(m):
        k = lower.copy()
        k[c] = upper[c]
        seeds.append(k)
    rankings = (
        units.busy_power_w / units.rate_steps_per_s,   # energy per step (energy, EDP)
        -units.rate_steps_per_s,                        # fastest first (time)
        units.busy_power_w,                             # lowest power first (power caps)
    )
    for ranking in rankings:
        prefix = lower.copy()
        for c in np.argsort(ranking, kind="stable"):
            prefix = prefix.copy()
            prefix[c] = upper[c]
            seeds.append(prefix)
    seeds = clip(np.unique(np.array(seeds), axis=0))
    seed_scores = scorer.score(seeds)
    order = np.lexsort((seed_scores[:, 1], seed_scores[:, 0]))[:starts]

    moves = []
    for c in range(m):
        for sign in (1, -1):
            e = np.zeros(m, dtype=np.int64)
            e[c] = sign
            moves.append(e)
    for c in range(m):
        for d in range(m):
            if c != d:
                e = np.zeros(m, dtype=np.int64)
                e[c], e[d] = 1, -1
                moves.append(e)
    moves = np.array(moves)

    for start in order:
        current, current_score = seeds[start].copy(), seed_scores[start]
        step = np.maximum(upper // 2, 1)
        while True:
            candidates = clip(current[None, :] + moves * step[None, :])
            candidates = np.unique(candidates[np.any(candidates != current, axis=1)], axis=0)
            if len(candidates):
                scores = scorer.score(candidates)
                best = _best(scores)
                if _better(scores[best], current_score):
                    current, current_score = candidates[best], scores[best]
                    continue
            if np.all(step == 1):
                improved = False
                for c in range(m):  # exact line search per class
                    line = np.repeat(current[None, :], upper[c] - lower[c] + 1, axis=0)
                    line[:, c] = np.arange(lower[c], upper[c] + 1)
                    line = clip(line)
                    scores = scorer.score(line)
                    best = _best(scores)
                    if _better(scores[best], current_score):
                        current, current_score, improved = line[best], scores[best], True
                if not improved:
                    break
            step = np.maximum(step // 2, 1)
    seen = np.array([np.frombuffer(key, dtype=np.int64) for key in scorer.seen])
    log.info("pattern search evaluated %d of %d count vectors", len(seen), count_class_configurations(units.counts))
    return seen

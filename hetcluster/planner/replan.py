"""Re-planning in the middle of a job: keep training on the configuration that runs now, or switch.

A running ParameterServerStrategy cluster cannot take a new worker (ClusterCoordinator fixes its
worker list when it is built), so a switch stops it and starts the new configuration from a
checkpoint. The choice compares, for the steps still to train, two kinds of option (pure: the
same estimate as the plan, from the same measurements):

    continue on C (the configuration training now, its lost members gone):
        T = t_now + N_rem / R(C)                  steady: its workers are warm
        E = E_now + P(C) · N_rem / R(C)

    switch to S:
        T = t_now + d + s + l(S) + t_run(S, N_rem − R(C)·d)
        E = E_now + P(C)·d + Σ_{i∈C} p_i·s + Σ_{i∈S} P_i·l(S) + E_run(S, N_rem − R(C)·d)

with d the drain (the running round ends while its steps still count), s the checkpoint and
stop, l(S) = max_{i∈S} l_i the slowest member's relaunch (every worker imports TensorFlow again:
busy power), and t_run, E_run the planner's fresh run (estimate.py: start-up and first steps
priced from pre-training's solo runs — the warm-up). The best option by the job's objective,
under its constraints, wins; a switch is taken only when it beats continuing. Each switch option
is also stated as its saving (continue against S trained steadily, with nothing paid to get
there) and its cost (that steady S against the switch): the switch wins exactly when the saving
exceeds the cost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from hetcluster.errors import InfeasibleError
from hetcluster.planner.choose import choose
from hetcluster.planner.constraints import Constraint, Require
from hetcluster.planner.estimate import EXACT_MAX_DEVICES, FittedModels, estimate
from hetcluster.planner.inputs import DeviceMeasurement, JobSpec, RunMeasurement
from hetcluster.planner.objectives import get_objective

log = logging.getLogger(__name__)

METRIC_COLUMNS = ("time_s", "power_w", "energy_j", "edp_js")


@dataclass(frozen=True)
class JobProgress:
    """Where the job stands when it re-plans: its total, the steps applied, and the time and
    energy spent so far (pre-training and every segment and switch before)."""

    total_steps: int
    steps_done: int
    elapsed_s: float
    energy_j: float
    idle_power_counts: bool = False

    @property
    def remaining_steps(self) -> int:
        return max(0, int(self.total_steps) - int(self.steps_done))


@dataclass(frozen=True)
class SwitchCost:
    """What a switch costs before the new configuration's fresh run starts: ``drain_s`` (the
    round in progress ends; its steps still train), ``stop_s`` (checkpoint and stop the servers)
    and each device's relaunch ``launch_s`` (its TF server up; ``default_launch_s`` where this job
    has not launched the device yet)."""

    drain_s: float = 0.0
    stop_s: float = 0.0
    launch_s: Mapping[str, float] = field(default_factory=dict)
    default_launch_s: float = 0.0

    def launch_of(self, names: Sequence[str]) -> float:
        return max((self.launch_s.get(n, self.default_launch_s) for n in names), default=0.0)


@dataclass(frozen=True)
class Option:
    """One configuration's whole-job prediction from here: continuing (``switch`` False) or
    switching to it; ``steps_per_s`` its predicted throughput R(S), ``startup_s`` its fresh run's
    start-up (time past N/R(S)), ``launch_s`` the relaunch it pays."""

    devices: tuple[str, ...]
    switch: bool
    time_s: float
    power_w: float
    energy_j: float
    edp_js: float
    steps_per_s: float
    startup_s: float = 0.0
    launch_s: float = 0.0

    def metric(self, column: str) -> float:
        return float(getattr(self, column))


@dataclass(frozen=True)
class Replan:
    """The decision. ``current``: continuing on what trains now (None: nothing left training);
    ``candidate``: the best feasible switch option (None: none); ``steady``: the candidate as if
    trained steadily from here with nothing paid to get there, which splits it into a saving and
    a cost; ``switch``: whether the candidate beats continuing. ``reason`` says why no switch
    option could be weighed, when none could."""

    objective: str
    remaining_steps: int
    current: Option | None
    candidate: Option | None
    steady: Option | None
    cost: SwitchCost
    switch: bool = False
    reason: str = ""

    @property
    def unit(self) -> str:
        return get_objective(self.objective).unit

    @property
    def chosen(self) -> tuple[str, ...]:
        """The configuration to train on from here (empty: none)."""
        if self.switch and self.candidate is not None:
            return self.candidate.devices
        return self.current.devices if self.current is not None else ()

    def _metric(self, option: Option | None) -> float:
        return option.metric(get_objective(self.objective).column) if option is not None else float("nan")

    @property
    def saving(self) -> float:
        """What the candidate saves on the remaining steps, in the objective's unit: continuing
        against the candidate trained steadily from here (NaN with nothing to compare)."""
        return self._metric(self.current) - self._metric(self.steady)

    @property
    def switch_cost(self) -> float:
        """What switching to the candidate costs, in the objective's unit: drain, checkpoint and
        stop, relaunch, and its fresh run's warm-up (NaN without a candidate)."""
        return self._metric(self.candidate) - self._metric(self.steady)

    def line(self) -> str:
        """One line: what was weighed and what was decided, saving and cost both stated."""
        what = f"re-plan for the remaining {self.remaining_steps} steps by {self.objective}"
        if self.candidate is None:
            staying = f"; staying on {'+'.join(self.current.devices)}" if self.current is not None else ""
            return f"{what}: {self.reason or 'no other configuration to switch to'}{staying}"
        target = "+".join(self.candidate.devices)
        cost = f"{_amount(self.switch_cost, self.unit)} ({self._cost_parts()})"
        if self.current is None:
            return f"{what}: nothing trains now; switching to {target} (switching costs {cost})"
        here = "+".join(self.current.devices)
        if self.switch:
            return (f"{what}: {target} saves {_amount(self.saving, self.unit)}, switching costs {cost}; "
                    f"switching from {here}")
        if not self.saving > 0:
            return (f"{what}: no other configuration saves anything (the best, {target}, would save "
                    f"{_amount(self.saving, self.unit)} trained steadily); staying on {here}")
        return (f"{what}: {target} would save {_amount(self.saving, self.unit)}, switching would cost {cost}; "
                f"staying on {here}")

    def _cost_parts(self) -> str:
        option = self.candidate
        drain = f"drain {self.cost.drain_s:.1f} s, " if self.current is not None else ""
        return (f"{drain}checkpoint and stop {self.cost.stop_s:.1f} s, relaunch {option.launch_s:.1f} s, "
                f"warm-up {option.startup_s:.1f} s")

    def to_dict(self) -> dict:
        def option(o: Option | None) -> dict | None:
            return None if o is None else {**o.__dict__, "devices": list(o.devices)}

        return {"objective": self.objective, "remaining_steps": self.remaining_steps, "switch": self.switch,
                "chosen": list(self.chosen), "current": option(self.current), "candidate": option(self.candidate),
                "steady": option(self.steady), "saving": _finite(self.saving),
                "switch_cost": _finite(self.switch_cost), "unit": self.unit,
                "cost": {"drain_s": self.cost.drain_s, "stop_s": self.cost.stop_s,
                         "launch_s": dict(self.cost.launch_s), "default_launch_s": self.cost.default_launch_s},
                "reason": self.reason, "line": self.line()}


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _amount(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}" if np.isfinite(value) else "-"


def replan(devices: Sequence[DeviceMeasurement], runs: Sequence[RunMeasurement], progress: JobProgress,
           current: Sequence[str], objective: str, constraints: Sequence[Constraint] = (),
           cost: SwitchCost = SwitchCost()) -> Replan:
    """Weigh continuing on ``current`` (those of its devices still training; empty when none is)
    against switching to any configuration of ``devices`` (the fleet's available, measured
    devices), for the remaining steps of ``progress``. A required device that is not available is
    no longer required (it left)."""
    devices = tuple(devices)
    names = {d.name for d in devices}
    current = tuple(n for n in current if n in names)
    objective = get_objective(objective).name
    constraints = tuple(_available_only(c, names) for c in constraints)
    remaining = progress.remaining_steps
    if remaining <= 0 or not devices:
        return Replan(objective, remaining, None, None, None, cost, reason="nothing left to plan")
    job = JobSpec(total_steps=remaining, pretrain_steps=0, pretrain_time_s=progress.elapsed_s,
                  pretrain_energy_j=progress.energy_j, idle_power_counts=progress.idle_power_counts)
    mode = "devices" if len(devices) <= EXACT_MAX_DEVICES else "classes"
    models = FittedModels.fit(devices, runs, job)
    fresh = estimate(devices, runs, job, mode=mode, models=models, first=current)
    warm = tuple(_steady(d) for d in devices)
    steady = estimate(warm, runs, job, mode=mode, models=FittedModels.fit(warm, runs, job), first=current)
    by_set = {frozenset(row): i for i, row in enumerate(steady["devices"])}
    continuing = None
    if current:
        row = steady.iloc[by_set[frozenset(current)]]
        continuing = _steady_option(row, progress, switch=False)
    table = _options_table(fresh, continuing, progress, cost, devices, current)
    try:
        plan = choose(table, objective, constraints)
    except InfeasibleError as error:
        return Replan(objective, remaining, continuing, None, None, cost, reason=error.message)
    switches = plan.table[plan.table["feasible"].to_numpy() & plan.table["switch"].to_numpy()]
    if switches.empty:
        return Replan(objective, remaining, continuing, None, None, cost)
    candidate = _option_of(switches.iloc[0])
    steady_row = steady.iloc[by_set[frozenset(candidate.devices)]]
    candidate_steady = _steady_option(steady_row, progress, switch=True, launch_s=candidate.launch_s,
                                      startup_s=candidate.startup_s)
    return Replan(objective, remaining, continuing, candidate, candidate_steady, cost,
                  switch=bool(plan.chosen_row["switch"]))


def _available_only(constraint: Constraint, names: set[str]) -> Constraint:
    if isinstance(constraint, Require):
        kept = tuple(n for n in constraint.names if n in names)
        if kept != constraint.names:
            log.warning("no longer requiring %s: not available", ", ".join(set(constraint.names) - set(kept)))
        return Require(kept)
    return constraint


def _steady(device: DeviceMeasurement) -> DeviceMeasurement:
    """The device as if already warm: no start-up, no slow first step."""
    return replace(device, first_step_s=0.0, startup_s=0.0, startup_power_w=0.0)


def _steady_option(row: pd.Series, progress: JobProgress, *, switch: bool, launch_s: float = 0.0,
                   startup_s: float = 0.0) -> Option:
    return Option(devices=tuple(row["devices"]), switch=switch, time_s=float(row["time_s"]),
                  power_w=float(row["power_w"]), energy_j=float(row["energy_j"]), edp_js=float(row["edp_js"]),
                  steps_per_s=float(row["steps_per_s"]), startup_s=startup_s, launch_s=launch_s)


def _option_of(row: pd.Series) -> Option:
    return Option(devices=tuple(row["devices"]), switch=bool(row["switch"]), time_s=float(row["time_s"]),
                  power_w=float(row["power_w"]), energy_j=float(row["energy_j"]), edp_js=float(row["edp_js"]),
                  steps_per_s=float(row["steps_per_s"]), startup_s=float(row["startup_s"]),
                  launch_s=float(row["launch_s"]))


def _options_table(fresh: pd.DataFrame, continuing: Option | None, progress: JobProgress, cost: SwitchCost,
                   devices: tuple[DeviceMeasurement, ...], current: tuple[str, ...]) -> pd.DataFrame:
    """The fresh estimate turned into switch options (drain, stop and relaunch added; the
    configuration running now left out), and the continue option as one more row."""
    busy_w = {d.name: d.busy_power_w for d in devices}
    idle_w = {d.name: d.idle_power_w for d in devices}
    remaining = progress.remaining_steps
    rate = fresh["steps_per_s"].to_numpy(dtype=np.float64)
    run_s = fresh["time_s"].to_numpy(dtype=np.float64) - progress.elapsed_s
    run_j = fresh["energy_j"].to_numpy(dtype=np.float64) - progress.energy_j
    startup_s = np.maximum(run_s - remaining / rate, 0.0)
    drain_s = cost.drain_s if continuing is not None else 0.0
    drained = min(remaining, continuing.steps_per_s * drain_s) if continuing is not None else 0.0
    # the fresh run trains what the drain left: its steady part shrinks by those steps
    run_after_s = np.maximum(run_s - drained / rate, startup_s)
    run_after_j = run_j * run_after_s / np.maximum(run_s, 1e-12)
    launch_s = np.array([cost.launch_of(row) for row in fresh["devices"]])
    gap_j = np.array([sum(busy_w[n] for n in row) for row in fresh["devices"]]) * launch_s
    gap_j += sum(idle_w[n] for n in current) * cost.stop_s
    drain_j = continuing.power_w * drain_s if continuing is not None else 0.0
    time_s = progress.elapsed_s + drain_s + cost.stop_s + launch_s + run_after_s
    energy_j = progress.energy_j + drain_j + gap_j + run_after_j
    table = fresh.copy()
    table["time_s"], table["energy_j"] = time_s, energy_j
    table["power_w"] = (energy_j - progress.energy_j) / np.maximum(time_s - progress.elapsed_s, 1e-12)
    table["edp_js"] = energy_j * time_s
    table["startup_s"], table["launch_s"], table["switch"] = startup_s, launch_s, True
    if current:
        table = table[[frozenset(row) != frozenset(current) for row in table["devices"]]]
    if continuing is not None:
        same = fresh[[frozenset(r) == frozenset(current) for r in fresh["devices"]]].iloc[:1].copy()
        for column, value in (("time_s", continuing.time_s), ("energy_j", continuing.energy_j),
                              ("power_w", continuing.power_w), ("edp_js", continuing.edp_js),
                              ("steps_per_s", continuing.steps_per_s)):
            same[column] = value
        same["startup_s"], same["launch_s"], same["switch"] = 0.0, 0.0, False
        table = pd.concat([same, table], ignore_index=True)
    table.attrs.update(fresh.attrs)
    return table.reset_index(drop=True)

"""What longer pre-training windows could buy: the planner fed one whole training round's own
measurements in place of pre-training's windows, and scored against the other round.

Against one training of every configuration (the reference's way of scoring) the planner is right as
often as a second training is (the rounds' agreement), while a planner that knew each configuration's
expected cost would be right in about 90 % of cases. Is the gap the pre-training windows (a
calibration set measured a median 1.4 s on these short jobs) or the truth's own round-to-round noise?
Each repeated-truth recording (experiments.recordings) keeps every configuration's trainings, round
by round, with each worker's steady rate, first step and the training phase's time. So for each scored round k, with
o the other round,
the planner can be re-fitted on what round o measured, as if pre-training's windows had lasted a
whole training phase, and scored against round k (round o's noise is not round k's: no leak).

Inputs (each column of cases.csv and summary.csv):

- ``pretraining``: the profile as recorded: today's planner, the headline's "against one round";
- ``solo rates``: each device's solo rate replaced by the steady rate its solo configuration trained
  at in round o (its window as long as that whole training phase; not revised by the sets, as a short
  window is: hetcluster/planner/solo_rates.py);
- ``solo runs``: also its first step and its start-up (the steady line's intercept), so that the
  planner predicts round o's training phase of each device alone exactly;
- ``solo runs and sets``: also each calibration set's members' rates, from round o's training of the
  set's configuration (the set's window kept, its steps at those rates);
- ``every configuration``: the solo runs, and every multi-device configuration's training of round o
  as a calibration set (its members' steady rates over the training phase, its power the phase's
  energy over its time): the planner's model smoothing one whole round of the truth;
- ``round o``: no planner: round o's best configuration (every configuration trained once; the rounds'
  agreement).

A device whose solo configuration was not trained by name (a fleet of identical devices planned as
classes) keeps its pre-training measurement; recordings whose trainings did not record each worker's
steady rate (before that was kept) are skipped.

    .venv/bin/python -m experiments.investigations.measurement_bound [--recordings PATH] [--out DIR]

No training: it reads the recordings dataset (results/choice_accuracy/recordings.parquet, or
--recordings: another dataset or a folder of results folders) and re-fits the planner five times per
scored round; summary.csv goes to results/choice_accuracy/measurement-bound/.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any, Sequence

from experiments.common import case_scopes, run_case_experiment
from experiments.investigations import set_value
from experiments.investigations.set_value import OBJECTIVES
from experiments.recordings import Recording

log = logging.getLogger("measurement_bound")

SOURCES = ("pretraining", "solo rates", "solo runs", "solo runs and sets", "every configuration", "round o")
PLANNED = SOURCES[:-1]


def choices(devices: list, runs: list, job: Any, source: str) -> dict[str, frozenset]:
    """Each objective's chosen configuration, the planner fitted on ``source``'s inputs: a solo rate
    a whole training phase measured is not revised by the sets (solo_rates.py revises a short window)."""
    return set_value.choices(devices, runs, job, revise_rates=source == "pretraining")


def has_worker_rates(evaluation: dict[str, Any]) -> bool:
    """Whether every training of every configuration recorded each worker's steady rate."""
    return all("steady_steps_per_s" in run for config in evaluation["configurations"] for run in config["runs"])


def inputs_from_round(evaluation: dict[str, Any], total_steps: int, round_index: int,
                      source: str) -> tuple[list, list, Any]:
    """(devices, runs, job) for the planner: the recorded profile's, with what ``source`` (one of
    PLANNED) replaces taken from training round ``round_index`` of the truth."""
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    devices, runs, job = to_planner_inputs(Profile.from_dict(evaluation["profile"]), total_steps)
    if source == "pretraining":
        return devices, runs, job
    trained = {frozenset(c["devices"]): c["runs"][round_index] for c in evaluation["configurations"]}
    revised = []
    for device in devices:
        run = trained.get(frozenset([device.name]))
        if run is None or device.name not in run["steady_steps_per_s"]:
            revised.append(device)   # not trained alone by this name: its pre-training window stays
            continue
        rate = run["steady_steps_per_s"][device.name]
        changes: dict[str, float] = {"steps_per_s": rate}
        if source != "solo rates":   # the fluid model's solo phase N/r + L is then the trained phase's time
            changes.update(first_step_s=run["first_step_s"][device.name],
                           startup_s=max(run["time_s"] - job.remaining_steps / rate, 0.0))
        revised.append(dataclasses.replace(device, **changes))
    if source == "solo runs and sets":
        runs = [set_from_round(r, trained.get(frozenset(r.devices))) for r in runs]
    if source == "every configuration":
        runs = [set_from_training(devices_of, run) for devices_of, run in
                ((tuple(c["devices"]), c["runs"][round_index]) for c in evaluation["configurations"])
                if len(devices_of) > 1 and all(name in run["steady_steps_per_s"] for name in devices_of)]
    return revised, runs, job


def member_rates(devices: Sequence[str], rates: dict[str, float], time_s: float) -> dict[str, Any]:
    """A RunMeasurement's rate fields for members training at ``rates`` over ``time_s``: its steps,
    aggregate rate and each member's steps (rate × time, not rounded)."""
    per_device = {name: rates[name] * time_s for name in devices}
    return {"steps": int(round(sum(per_device.values()))), "steps_per_s": sum(rates[name] for name in devices),
            "per_device_steps": per_device}


def set_from_training(devices: tuple[str, ...], run: dict[str, Any]) -> Any:
    """One training of a multi-device configuration as a calibration set's RunMeasurement: its
    members' steady rates over the training phase's time, each member's power its energy over that time."""
    from hetcluster.planner.inputs import RunMeasurement

    time_s = run["time_s"]
    power_w = {name: run["energy_per_device_j"][name] / time_s for name in devices}
    return RunMeasurement(devices=devices, time_s=time_s, power_w=sum(power_w.values()), per_device_power_w=power_w,
                          **member_rates(devices, run["steady_steps_per_s"], time_s))


def set_from_round(measured: Any, trained_run: dict[str, Any] | None) -> Any:
    """A calibration set's RunMeasurement with its members' rates those its configuration trained at
    (``trained_run``, one round's training of it), over the set's own window; unchanged without one."""
    rates = (trained_run or {}).get("steady_steps_per_s", {})
    if not all(name in rates for name in measured.devices):
        return measured
    return dataclasses.replace(measured, **member_rates(measured.devices, rates, measured.time_s))


def round_best(evaluation: dict[str, Any], round_index: int, objective: str) -> frozenset:
    """The configuration that measured best in training round ``round_index`` (as scoring.round_bests
    finds it, from the recorded JSON)."""
    from hetcluster.evaluation.scoring import OBJECTIVE_METRIC

    metric = OBJECTIVE_METRIC[objective]
    return frozenset(min(evaluation["configurations"], key=lambda c: c["repeats"][round_index][metric])["devices"])


def recording_rows(recording: Recording) -> list[dict[str, Any]]:
    """One row per objective and scored round of one recording: round k's best and each source's
    choice (PLANNED fitted on round o = 1 − k), exact against round k or not."""
    evaluation, total_steps = recording.evaluation, recording.total_steps
    rows = []
    for scored in (0, 1):
        other = 1 - scored
        chosen = {
            source: choices(*inputs_from_round(evaluation, total_steps, other, source), source) for source in PLANNED
        }
        for name in OBJECTIVES:
            best = round_best(evaluation, scored, name)
            picks = {
                **{source: chosen[source][name] for source in PLANNED},
                "round o": round_best(evaluation, other, name),
            }
            row = {"recording": recording.label, "devices": len(evaluation["profile"]["devices"]),
                   "objective": name, "round": scored, "best": "+".join(sorted(best))}
            row.update({source: pick == best for source, pick in picks.items()})
            row.update({f"{source} chose": "+".join(sorted(pick)) for source, pick in picks.items()})
            rows.append(row)
    return rows


def rows_of(recordings: list[Recording]) -> list[dict[str, Any]]:
    """recording_rows of every recording the headline scores (Recording.scored) whose trainings kept
    each worker's steady rate (the others skipped, counted in the log)."""
    scored = [r for r in recordings if r.scored]
    with_rates = [r for r in scored if has_worker_rates(r.evaluation)]
    if len(with_rates) < len(scored):
        log.warning("skipped %d repeated-truth recordings trained before each worker's steady rate was kept",
                    len(scored) - len(with_rates))
    rows = [row for r in with_rates for row in recording_rows(r)]
    if not rows:
        raise SystemExit("no counted repeated-truth recording with each worker's steady rate")
    return rows


def summary(rows: Any) -> Any:
    """Exact counts against one round per source: all cases, by objective and by fleet size."""
    import pandas as pd

    return pd.DataFrame([{"scope": scope, "cases": len(group), "recordings": group["recording"].nunique(),
                          **{source: int(group[source].sum()) for source in SOURCES}}
                         for scope, group in case_scopes(rows)])


def main(argv: list[str] | None = None) -> int:
    return run_case_experiment(argv, __doc__.splitlines()[0], "measurement-bound", rows_of, summary)


if __name__ == "__main__":
    sys.exit(main())

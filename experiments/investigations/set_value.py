"""What pre-training's calibration sets buy: the planner's choices with fewer of the recorded sets,
and with a set picked after a first plan instead of fixed in advance.

Pre-training measures every device alone, then up to three multi-device sets in a fixed order
(hetcluster/profiling/sets.py: the whole fleet, the two fastest, all but the fastest). Each
repeated-truth recording (experiments.recordings) keeps every set's measurement, so
today's planner can re-plan from a prefix of them and be scored against the same truth, as
replan.py does with all of them. Policies, per recording and objective:

- ``none``: the solo runs only (replan.py --without-sets);
- ``first 1``, ``first 2``: the solo runs and the first one or two recorded sets;
- ``all``: every recorded set (the headline, replan.py --all-repeated);
- ``adaptive``: the solo runs and the first set; plan; if the objective's choice or its closest
  near-tie (Plan.near_ties) is one of the other recorded sets, add that set (one at most) and plan
  again. For one objective it measures at most two sets, as ``first 2`` does, but picks the second
  for the configuration the decision hinges on. It can add only a set that pre-training did measure
  (the recorded second or third), so it bounds from below what measuring any named candidate would do.

A choice is exact when it is the configuration whose trainings measured best (the mean over the
rounds); "separated" counts only the cases whose rounds tell the best apart from every other
configuration (evaluation.scoring), as the headline does.

    .venv/bin/python -m experiments.investigations.set_value [--recordings PATH] [--out DIR]

No training: it reads the recordings dataset (results/choice_accuracy/recordings.parquet, or
--recordings: another dataset or a folder of results folders) and re-fits the planner on each
profile; summary.csv goes to results/choice_accuracy/set-value/.
"""

from __future__ import annotations

import sys
from typing import Any

from experiments.common import case_scopes, run_case_experiment
from experiments.recordings import Recording
from experiments.replan import replan

OBJECTIVES = ("time", "power", "energy", "edp")
POLICIES = ("none", "first 1", "first 2", "all", "adaptive")


def choices(devices: list, runs: list, job: Any, *, revise_rates: bool = True) -> dict[str, frozenset]:
    """Each objective's chosen configuration when the planner is fitted on ``runs`` (the sets kept)."""
    return {name: frozenset(p.chosen) for name, p in plans(devices, runs, job, revise_rates=revise_rates).items()}


def plans(devices: list, runs: list, job: Any, *, revise_rates: bool = True) -> dict[str, Any]:
    """Each objective's Plan from the planner fitted on the solo measurements and ``runs``
    (revise_rates: FittedModels.fit's, the solo windows revised by the sets)."""
    from hetcluster.cli.cmd_evaluate import plans_by_objective
    from hetcluster.planner import FittedModels, plan

    models = FittedModels.fit(devices, runs, job, revise_rates=revise_rates)
    return plans_by_objective(plan(devices, runs, job, "edp", (), models=models).table, list(OBJECTIVES))


def adaptive_choices(devices: list, runs: list, job: Any,
                     first: dict[str, Any]) -> dict[str, tuple[frozenset, bool]]:
    """(choice, whether a set was added) per objective under the ``adaptive`` policy, from ``first``:
    the plans fitted on the first set (each added set is fitted once, whichever objectives add it)."""
    with_added: dict[int, dict[str, frozenset]] = {}
    result = {}
    for name, p in first.items():
        named = [frozenset(p.chosen)] + [frozenset(t) for t in p.near_ties(1)["devices"]]
        added = [i for i, r in enumerate(runs) if i > 0 and frozenset(r.devices) in named]
        if added:
            if added[0] not in with_added:
                with_added[added[0]] = choices(devices, [runs[0], runs[added[0]]], job)
            result[name] = (with_added[added[0]][name], True)
        else:
            result[name] = (frozenset(p.chosen), False)
    return result


def recording_rows(recording: Recording) -> list[dict[str, Any]]:
    """One row per objective of one recording: the truth's best and each policy's choice, exact or not."""
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    evaluation, total_steps = recording.evaluation, recording.total_steps
    scored = replan(evaluation, total_steps)["objectives"]   # every set: today's choice, the truth's best, separation
    devices, runs, job = to_planner_inputs(Profile.from_dict(evaluation["profile"]), total_steps)
    first = plans(devices, runs[:1], job)
    chosen = {"none": choices(devices, [], job),
              "first 1": {name: frozenset(p.chosen) for name, p in first.items()},
              "first 2": choices(devices, runs[:2], job),
              "all": {name: frozenset(score["chosen"]) for name, score in scored.items()}}
    adaptive = adaptive_choices(devices, runs, job, first)
    rows = []
    for name in OBJECTIVES:
        best = frozenset(scored[name]["best"])
        row = {"recording": recording.label, "devices": len(devices), "sets": len(runs),
               "objective": name, "best": "+".join(sorted(best)), "separated": bool(scored[name]["separated"]),
               "adaptive_added_set": adaptive[name][1]}
        chosen_now = {**{policy: chosen[policy][name] for policy in POLICIES[:-1]}, "adaptive": adaptive[name][0]}
        row.update({policy: choice == best for policy, choice in chosen_now.items()})
        row.update({f"{policy} chose": "+".join(sorted(choice)) for policy, choice in chosen_now.items()})
        rows.append(row)
    return rows


def rows_of(recordings: list[Recording]) -> list[dict[str, Any]]:
    """recording_rows of every recording the headline scores (Recording.scored) that measured
    calibration sets."""
    rows = [row for r in recordings if r.scored and r.evaluation["profile"]["runs"] for row in recording_rows(r)]
    if not rows:
        raise SystemExit("no counted repeated-truth recording with calibration sets")
    return rows


def summary(rows: Any) -> Any:
    """Exact counts per policy: all cases, the separated ones, by objective and by fleet size."""
    import pandas as pd

    frames = []
    for scope, group in case_scopes(rows):
        separated = group[group["separated"]]
        record = {"scope": scope, "cases": len(group), "separated": len(separated),
                  "adaptive_added_set": int(group["adaptive_added_set"].sum())}
        for policy in POLICIES:
            record[policy] = int(group[policy].sum())
            record[f"{policy} (separated)"] = int(separated[policy].sum())
        frames.append(record)
    return pd.DataFrame(frames)


def main(argv: list[str] | None = None) -> int:
    return run_case_experiment(argv, __doc__.splitlines()[0], "set-value", rows_of, summary)


if __name__ == "__main__":
    sys.exit(main())

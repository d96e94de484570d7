"""Re-score today's planner against a recorded ground truth, without training anything again.

`hetcluster evaluate` keeps the whole pre-training profile beside every configuration's measured
time, power and energy (raw/<model>.json of experiments.choice_accuracy). The measurements do
not depend on what the planner predicted — every configuration is trained — so the planner of
this checkout can re-predict from the same profile and be scored against the same truth: a fair
before/after for a change to the model, and ablations: --without-startup plans as if
pre-training had not measured each device's start-up, --without-startup-power as if it had
measured the start-up's duration but not its power (priced at training power, as before),
--without-sets as if pre-training had run each device alone and no calibration set (no contention
fitted: a configuration's rate is the sum of its members' solo rates, its power the sum of theirs),
--without-rate-revision with the sets but each device's solo rate as its window read it, not
revised by what the sets measured of it (hetcluster/planner/solo_rates.py). --as-lanes replays
what pre-training on lanes (the default protocol) would have measured of a sequential recording
under a budget (--pretrain-budget, default the product's): each device's first solo window (its
recorded step stamps), the fleet's set, then the fastest device's second window and the further
sets only where the budget affords them, as profiling/lane_phase.py decides (as_lanes).

    .venv/bin/python -m experiments.replan --all-repeated [--without-sets | --without-rate-revision |
        --as-lanes [--pretrain-budget F]]
    .venv/bin/python -m experiments.replan --from DIR [--to DIR] [--check] [--without-startup |
    --without-startup-power | --without-sets | --without-rate-revision]

--all-repeated re-scores every counted repeated-truth recording of the dataset
(results/choice_accuracy/recordings.parquet, experiments.recordings; --recordings reads another
dataset or a folder of raw recordings) in one table: summary.csv has a row per objective, one for
all, and one for "unseen", the recordings whose fleet and model were chosen before any of their
results were seen; summary.md holds its counts as a Markdown table, and the headline run (no
ablation, default --to) writes that table into docs/experiments.md, and the columns a reader needs
into the README, between their markers. --from
re-plans one results folder of experiments.choice_accuracy (DIR/raw/<model>.json, say a recording
not yet added to the dataset) into DIR/replanned[-without-<ablation>]/raw/ and renders it there as
choice_accuracy renders its own (CSV tables, figures). Memory fit is not re-applied (the recorded
jobs fit every device; an evaluation whose predictions cannot be reproduced says so: see --check).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from experiments.common import ROOT, write_json
from experiments.recordings import DATASET, Recording, in_folder, load
from hetcluster.fileio import write_text_atomic

log = logging.getLogger("replan")


ABLATIONS = {  # what each ablation clears in the recorded device measurements
    "startup": {"startup_s": 0.0, "first_step_s": 0.0, "startup_power_w": 0.0},
    "startup-power": {"startup_power_w": 0.0},
    "sets": {},  # and every multi-device run (replan drops them)
    "rate-revision": {},  # the solo windows as measured, not revised by the sets (planner/solo_rates.py)
    "lanes": {},  # each device's first solo window, the fleet's set alone (as_lanes)
}


def as_lanes(profile: Any, devices: list[Any], runs: list[Any], job: Any, objectives: Sequence[str],
             budget_share: float) -> tuple[list[Any], list[Any]]:
    """What pre-training on lanes (profiling/lane_phase.py) would have measured of a sequential
    recording: each device's first solo window (its rate, and the error its recorded step stamps
    give), the run of the whole fleet, the fastest device's second solo window where the time
    budget affords it, then each further recorded set in the protocol's order while some
    objective's choice is a near-tie and the budget affords it (``budget_share`` of the job, as
    --pretrain-budget). The budget is the product's: the lanes' own elapsed seconds and the training
    the planner predicts after the lanes' own steps (the solo run with the most steps within the
    step budget, then each run that stays within it), not the recording's. Elapsed seconds: the
    slowest solo run (the solo runs side by side, as on a fleet of separate machines), then each
    run's; a run takes its slowest member's start-up, the set-up overhead and its window."""
    from hetcluster.errors import PlanningError
    from hetcluster.planner import plan
    from hetcluster.profiling.lane_phase import SET_OVERHEAD_S
    from hetcluster.profiling.pretrain import PretrainSettings, budget_steps, rate_standard_error
    from hetcluster.profiling.sets import calibration_sets

    min_window_s = PretrainSettings().min_window_s
    recorded = {d.name: d for d in profile.devices}
    first, pooled = [], {}
    for device in devices:
        source = recorded[device.name]
        if len(source.solo_rates_steps_per_s) > 1 and source.solo_window_ends_s:
            pooled[device.name] = device
            rate = source.solo_rates_steps_per_s[0] * source.memory_slowdown
            std = rate_standard_error(sorted(source.solo_window_ends_s[0]), rate)
            device = dataclasses.replace(device, steps_per_s=rate, steps_per_s_std=std)
        first.append(device)
    by_members = {frozenset(r.devices): r for r in runs}
    fleet = frozenset(d.name for d in devices)
    kept = [by_members[fleet]] if fleet in by_members else []
    step_budget = budget_steps(job.total_steps, budget_share)

    def start_s(names: Sequence[str]) -> float:
        return max(recorded[n].first_step_s for n in names) + SET_OVERHEAD_S

    def solo(name: str) -> tuple[float, int]:   # one solo run of a device: its window's seconds, its steps
        windows = max(1, len(recorded[name].solo_rates_steps_per_s))
        return recorded[name].time_s / windows, recorded[name].steps // windows

    def continued(line: int, steps: int) -> int:   # the line after a run of ``steps``: adopted within the budget
        return line + steps if line + steps <= step_budget else line

    def opinion() -> tuple[bool, float]:
        """As cli.pretraining's choice check on the profile so far: whether some objective's choice
        has a near-tie, and the longest training the objectives' choices predict after it."""
        tie, training_s = False, 0.0
        so_far = dataclasses.replace(job, pretrain_steps=line, pretrain_time_s=elapsed_s)
        for objective in objectives:
            try:
                chosen = plan(first, kept, so_far, objective, ())
            except PlanningError:
                continue
            training_s = max(training_s, float(chosen.chosen_row["time_s"]) - elapsed_s)
            tie = tie or len(chosen.near_ties(limit=1)) > 0
        return tie, training_s

    def affords(names: Sequence[str], training_s: float) -> bool:   # the product's estimate of a run's seconds
        return elapsed_s + start_s(names) + min_window_s <= budget_share * (elapsed_s + training_s)

    elapsed_s = max(start_s([n]) + solo(n)[0] for n in fleet) + sum(start_s(list(fleet)) + r.time_s for r in kept)
    line = max((solo(n)[1] for n in fleet if solo(n)[1] <= step_budget), default=0)
    for run in kept:
        line = continued(line, run.steps)
    if pooled and affords(list(pooled), opinion()[1]):
        name = next(iter(pooled))
        first = [pooled.get(d.name, d) for d in first]
        elapsed_s += start_s([name]) + solo(name)[0]
        line = continued(line, solo(name)[1])
    for members in calibration_sets({d.name: d.steps_per_s for d in first})[1:]:
        run = by_members.get(frozenset(members))
        if run is None or run in kept:
            continue
        tie, training_s = opinion()
        if not tie or not affords(members, training_s):
            break
        kept.append(run)
        elapsed_s += start_s(members) + run.time_s
        line = continued(line, run.steps)
    return first, kept


def replan(evaluation: dict[str, Any], total_steps: int, *, without: str | None = None,
           lanes_budget: float | None = None) -> dict[str, Any]:
    """The evaluation as today's planner would have scored it: new predictions and choices, the
    same measurements (less what the ablation `without` clears: a key of ABLATIONS)."""
    from hetcluster.cli.cmd_evaluate import evaluation_dict, plans_by_objective
    from hetcluster.evaluation.scoring import ConfigurationResult
    from hetcluster.planner import FittedModels, plan
    from hetcluster.profiling.pretrain import DEFAULT_BUDGET_SHARE
    from hetcluster.profiling.profile import Profile, to_planner_inputs
    from hetcluster.training.report import JobMetrics

    profile = Profile.from_dict(evaluation["profile"])
    devices, runs, job = to_planner_inputs(profile, total_steps)
    if without:
        devices = [dataclasses.replace(d, **ABLATIONS[without]) for d in devices]
    if without == "sets":
        runs = []
    if without == "lanes":
        share = DEFAULT_BUDGET_SHARE if lanes_budget is None else lanes_budget
        devices, runs = as_lanes(profile, devices, runs, job, list(evaluation["objectives"]), share)
    models = FittedModels.fit(devices, runs, job, revise_rates=without != "rate-revision")
    table = plan(devices, runs, job, "edp", (), models=models).table
    predicted = {frozenset(row["devices"]): JobMetrics.from_mapping(row) for row in table.to_dict("records")}
    results = []
    for config in evaluation["configurations"]:
        devices_of = tuple(config["devices"])
        measured = JobMetrics.from_mapping(config["measured"]) if config.get("measured") else None
        details = {k: v for k, v in config.items() if k not in ("devices", "predicted", "measured", "error", "repeats")}
        results.append(ConfigurationResult(devices_of, predicted[frozenset(devices_of)], measured,
                                           error=config.get("error"), details=details,
                                           repeats=[JobMetrics.from_mapping(m) for m in config.get("repeats", [])]))
    plans = plans_by_objective(table, list(evaluation["objectives"]))
    pretrain = {
        "steps": profile.pretrain_steps,
        "time_s": profile.pretrain_time_s,
        "energy_j": profile.pretrain_energy_j,
    }
    return evaluation_dict(results, plans, pretrain, profile)


def largest_prediction_change(old: dict[str, Any], new: dict[str, Any]) -> float:
    """Largest relative difference between two evaluations' predicted times (a reproduction check)."""
    before = {frozenset(c["devices"]): c["predicted"]["time_s"] for c in old["configurations"]}
    return max(abs(c["predicted"]["time_s"] - before[frozenset(c["devices"])]) / before[frozenset(c["devices"])]
               for c in new["configurations"])


def replan_recording(recording: Recording, without: str | None = None, check: bool = False,
                     lanes_budget: float | None = None) -> dict[str, Any]:
    """The re-planned evaluation of one recording with a whole profile. check: fail unless the
    predictions reproduce the recorded ones."""
    new = replan(recording.evaluation, recording.total_steps, without=without, lanes_budget=lanes_budget)
    change = largest_prediction_change(recording.evaluation, new)
    log.info("%s: largest change of a predicted time %.2f %%", recording.label, 100 * change)
    if check and change > 1e-6:
        raise SystemExit(
            f"{recording.label}: re-planned predictions differ from the recorded ones by {100 * change:.3g} %"
        )
    return new


CHOICE_KEY = ["model", "objective"]
CHOICE_OUTCOME = ["chosen", "exact"]


def changed_choices(before: pd.DataFrame, after: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """How a re-scoring's choices differ from those an earlier one wrote (both choices.csv frames):
    the cases both have whose chosen configuration or exactness changed, with both outcomes
    (columns model, objective, chosen_before, exact_before, chosen_after, exact_after); the labels of
    the recordings only `after` has; and those of the recordings only `before` has (sorted)."""
    old = before.set_index(CHOICE_KEY)[CHOICE_OUTCOME].astype(str)
    new = after.set_index(CHOICE_KEY)[CHOICE_OUTCOME].astype(str)
    both = old.merge(new, left_index=True, right_index=True, suffixes=("_before", "_after"))
    differs = pd.concat([both[f"{c}_before"] != both[f"{c}_after"] for c in CHOICE_OUTCOME], axis=1).any(axis=1)
    moved = both[differs].reset_index()
    added = sorted({model for model, _ in new.index.difference(old.index)})
    removed = sorted({model for model, _ in old.index.difference(new.index)})
    return moved, added, removed


def rescore_repeated(recordings: Sequence[Recording], out: Path, without: str | None = None,
                     check: bool = False, lanes_budget: float | None = None) -> dict[str, Any]:
    """Today's planner on every recording the headline scores (Recording.scored: counted, a whole
    profile and a repeated truth), in one table (rows labelled <folder>/<model>): the accuracy over
    all of them, and over the unseen ones as the summary's scope "unseen". Where out holds an earlier
    choices.csv, logs the recordings it lacked and every earlier case whose choice changed
    (changed_choices)."""
    from experiments.accuracy import markdown_table, plot_accuracy, tables
    from experiments.common import REFERENCE_EXACT_RATE

    scored = [r for r in recordings if r.scored]
    if not scored:
        raise SystemExit("no counted repeated-truth recording with a whole profile")
    unscorable = sorted(r.label for r in recordings if r.unseen and not r.scored)
    if unscorable:
        raise SystemExit(f"recordings marked unseen that the headline cannot score: {', '.join(unscorable)}")
    runs = [(r.label, r.setting, replan_recording(r, without, check, lanes_budget)) for r in scored]
    unseen = [r.label for r in scored if r.unseen]
    groups = {"unseen": unseen} if unseen else {}
    frames = tables(runs, REFERENCE_EXACT_RATE, groups)
    if (out / "choices.csv").exists():   # what changed since the table this folder held
        moved, added, removed = changed_choices(pd.read_csv(out / "choices.csv"), frames["choices"])
        log.info("against the earlier %s: recordings new %s, gone %s; %d earlier choices changed%s",
                 out / "choices.csv", " ".join(added) or "none", " ".join(removed) or "none", len(moved),
                 ":\n" + moved.to_string(index=False) if len(moved) else "")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("choices", "summary"):
        frames[name].to_csv(out / f"{name}.csv", index=False)
    write_text_atomic(out / "summary.md", markdown_table(frames["summary"]))
    plot_accuracy(frames["summary"], REFERENCE_EXACT_RATE, out / "accuracy.png")
    return frames


TABLE_MARKERS = ("<!-- choice-accuracy table: from replanned-repeated/summary.csv, written by python -m "
                 "experiments.replan --all-repeated -->", "<!-- end of the choice-accuracy table -->")


def headline_tables(summary: pd.DataFrame) -> dict[Path, str]:
    """The pages that show the headline, each with its table: the README the columns a reader needs
    and the reference's rate, docs/experiments.md every column (summary.md's table)."""
    from experiments.accuracy import README_COLUMNS, markdown_table

    return {ROOT / "README.md": markdown_table(summary, README_COLUMNS, reference=True),
            ROOT / "docs" / "experiments.md": markdown_table(summary)}


def with_table(page: str, table: str) -> str:
    """``page`` with the text between TABLE_MARKERS replaced by ``table``, indented like the start
    marker (a table may sit in a list item)."""
    start, end = TABLE_MARKERS
    if page.count(start) != 1 or page.count(end) != 1 or page.index(start) > page.index(end):
        raise SystemExit(f"the page needs the choice-accuracy table's markers once each: {start} ... {end}")
    head, rest = page.split(start)
    indent = head[head.rfind("\n") + 1:]
    tail = rest.split(end)[1]
    body = "".join(f"{indent}{line}\n" if line else "\n" for line in table.splitlines())
    return f"{head}{start}\n{body}{indent}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--all-repeated", action="store_true",
                        help="every counted repeated-truth recording in one table (default --to: "
                             "results/choice_accuracy/replanned-repeated[-without-<ablation>])")
    source.add_argument("--from", dest="source", type=Path,
                        help="a results folder of experiments.choice_accuracy (DIR/raw/<model>.json)")
    parser.add_argument("--recordings", type=Path, default=DATASET,
                        help="with --all-repeated: the dataset, or a folder of results folders (default: %(default)s)")
    parser.add_argument("--to", type=Path, help="where the results go")
    ablation = parser.add_mutually_exclusive_group()
    ablation.add_argument("--without-startup", dest="without", action="store_const", const="startup",
                          help="plan without the measured start-up (ablation)")
    ablation.add_argument("--without-startup-power", dest="without", action="store_const", const="startup-power",
                          help="price the start-up at training power, as before it was measured (ablation)")
    ablation.add_argument("--without-sets", dest="without", action="store_const", const="sets",
                          help="plan from the solo runs alone, no calibration set (ablation)")
    ablation.add_argument("--without-rate-revision", dest="without", action="store_const", const="rate-revision",
                          help="keep the solo windows' rates, not revised by the sets (ablation)")
    ablation.add_argument("--as-lanes", dest="without", action="store_const", const="lanes",
                          help="replay pre-training on lanes: first solo windows, the fleet's set alone")
    parser.add_argument("--pretrain-budget", type=float,
                        help="with --as-lanes: the budget's share of the job (default: the product's)")
    parser.add_argument("--check", action="store_true",
                        help="fail unless the re-planned predictions equal the recorded ones (same planner)")
    args = parser.parse_args(argv)
    if args.pretrain_budget is not None and args.without != "lanes":
        parser.error("--pretrain-budget goes with --as-lanes")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    suffix = f"-without-{args.without}" if args.without else ""
    if args.without == "lanes":
        suffix = "-as-lanes" + (f"-budget-{args.pretrain_budget:g}" if args.pretrain_budget is not None else "")
    if args.all_repeated:
        out = (args.to or DATASET.parent / f"replanned-repeated{suffix}").resolve()
        frames = rescore_repeated(load(args.recordings), out, args.without, args.check, args.pretrain_budget)
        log.info("summary:\n%s", frames["summary"].to_string(index=False))
        if args.to is None and args.without is None and args.recordings == DATASET:   # the headline: pages show it
            for page, table in headline_tables(frames["summary"]).items():
                write_text_atomic(page, with_table(page.read_text(), table))
                log.info("the choice-accuracy table of %s now shows %s", page, out / "summary.csv")
        log.info("results in %s", out)
        return 0
    from experiments.choice_accuracy import EXTRA, FULL, REDUCED, render

    settings = {s.model: s for s in FULL + REDUCED + EXTRA}
    out = (args.to or args.source / f"replanned{suffix}").resolve()
    done = []
    for recording in in_folder(args.source):
        if not recording.whole_profile:
            log.warning("skipping %s: recorded before evaluate kept the whole profile", recording.label)
            continue
        write_json(out / "raw" / f"{recording.model}.json",
                   replan_recording(recording, args.without, args.check, args.pretrain_budget))
        write_json(out / "raw" / f"{recording.model}.setting.json", recording.setting)
        done.append(settings[recording.model])
    if not done:
        raise SystemExit(f"no evaluation with a whole profile in {args.source / 'raw'}")
    frames = render(out, tuple(done))
    log.info("summary:\n%s", frames["summary"].to_string(index=False))
    log.info("results in %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

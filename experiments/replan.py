"""Re-score today's planner against a recorded ground truth, without training anything again.

`hetcluster evaluate` keeps the whole pre-training profile beside every configuration's measured
time, power and energy (raw/<model>.json of experiments/choice_accuracy.py). The measurements do
not depend on what the planner predicted — every configuration is trained — so the planner of
this checkout can re-predict from the same profile and be scored against the same truth: a fair
before/after for a change to the model, and ablations: --without-startup plans as if
pre-training had not measured each device's start-up, --without-startup-power as if it had
measured the start-up's duration but not its power (priced at training power, as before),
--without-sets as if pre-training had run each device alone and no calibration set (no contention
fitted: a configuration's rate is the sum of its members' solo rates, its power the sum of theirs),
--without-rate-revision with the sets but each device's solo rate as its window read it, not
revised by what the sets measured of it (hetcluster/planner/solo_rates.py).

    .venv/bin/python -m experiments.replan [--from DIR] [--to DIR] [--without-startup | --without-startup-power | --without-sets | --without-rate-revision]
    .venv/bin/python -m experiments.replan --all-repeated [--without-sets | --without-rate-revision]   # the headline over every repeated truth

--all-repeated's summary.csv has a row per objective, one for all, and one for "unseen": the recordings
listed in results/choice_accuracy/unseen.txt, whose fleet and model were chosen before any of their results
were seen; summary.md holds its counts as a Markdown table, which the headline run (no ablation, default
--to) also writes into the README between its markers. DIR defaults to
experiments/results/choice_accuracy/full; the re-planned results go to
<from>/replanned[-without-<ablation>]/raw/ and are rendered there like choice_accuracy.py renders its
own (CSV tables, figures). Memory fit is not re-applied (the recorded jobs fit every device;
an evaluation whose predictions cannot be reproduced says so: see --check).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.common import RESULTS, ROOT, read_json, write_json
from hetcluster.fileio import write_text_atomic

log = logging.getLogger("replan")


ABLATIONS = {  # what each ablation clears in the recorded device measurements
    "startup": {"startup_s": 0.0, "first_step_s": 0.0, "startup_power_w": 0.0},
    "startup-power": {"startup_power_w": 0.0},
    "sets": {},  # and every multi-device run (replan drops them)
    "rate-revision": {},  # the solo windows as measured, not revised by the sets (planner/solo_rates.py)
}


def replan(evaluation: dict[str, Any], total_steps: int, *, without: str | None = None) -> dict[str, Any]:
    """The evaluation as today's planner would have scored it: new predictions and choices, the
    same measurements (less what the ablation `without` clears: a key of ABLATIONS)."""
    from hetcluster.cli.cmd_evaluate import evaluation_dict, plans_by_objective
    from hetcluster.evaluation.scoring import ConfigurationResult
    from hetcluster.planner import FittedModels, plan
    from hetcluster.profiling.profile import Profile, to_planner_inputs
    from hetcluster.training.report import JobMetrics

    profile = Profile.from_dict(evaluation["profile"])
    devices, runs, job = to_planner_inputs(profile, total_steps)
    if without:
        devices = [dataclasses.replace(d, **ABLATIONS[without]) for d in devices]
    if without == "sets":
        runs = []
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
    pretrain = {"steps": profile.pretrain_steps, "time_s": profile.pretrain_time_s, "energy_j": profile.pretrain_energy_j}
    return evaluation_dict(results, plans, pretrain, profile)


def largest_prediction_change(old: dict[str, Any], new: dict[str, Any]) -> float:
    """Largest relative difference between two evaluations' predicted times (a reproduction check)."""
    before = {frozenset(c["devices"]): c["predicted"]["time_s"] for c in old["configurations"]}
    return max(abs(c["predicted"]["time_s"] - before[frozenset(c["devices"])]) / before[frozenset(c["devices"])]
               for c in new["configurations"])


def replan_file(result: Path, without: str | None = None, check: bool = False,
                repeated_only: bool = False) -> tuple[dict, dict] | None:
    """(setting, re-planned evaluation) of one recorded raw/<model>.json; None when the recording
    predates evaluate keeping the whole profile, or with repeated_only when its truth was trained
    once (skipped before planning). check: fail unless the predictions reproduce."""
    evaluation = read_json(result)
    if "format_version" not in evaluation.get("profile", {}):
        log.warning("skipping %s: recorded before evaluate kept the whole profile", result)
        return None
    if repeated_only and not repeated_truth(evaluation):
        return None
    setting = read_json(result.with_suffix(".setting.json"))
    new = replan(evaluation, int(setting["total_steps"]), without=without)
    change = largest_prediction_change(evaluation, new)
    log.info("%s: largest change of a predicted time %.2f %%", result, 100 * change)
    if check and change > 1e-6:
        raise SystemExit(f"{result}: re-planned predictions differ from the recorded ones by {100 * change:.3g} %")
    return setting, new


def recordings(raw_dir: Path) -> list[Path]:
    """The evaluations (raw/<model>.json beside its .setting.json) of one results folder."""
    return [r for r in sorted(raw_dir.glob("*.json"))
            if not r.name.endswith(".setting.json") and r.with_suffix(".setting.json").exists()]


def repeated_truth(evaluation: dict[str, Any]) -> bool:
    """Whether every configuration of an evaluation was trained more than once."""
    return all(len(c.get("repeats", [])) > 1 for c in evaluation["configurations"])


def unseen_folders(root: Path) -> set[str]:
    """The recording folders listed in root/unseen.txt (one per line, # comments): those whose fleet
    and model were chosen before any of their results were seen. None listed without the file."""
    listing = root / "unseen.txt"
    if not listing.exists():
        return set()
    return {line.strip() for line in listing.read_text().splitlines() if line.strip() and not line.startswith("#")}


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


def rescore_repeated(root: Path, out: Path, without: str | None = None, check: bool = False) -> dict[str, Any]:
    """Today's planner on every repeated-truth recording under root/<folder>/raw/, in one table
    (rows labelled <folder>/<model>): the headline accuracy over all of them, and over the unseen
    ones (root/unseen.txt) as the summary's scope "unseen". Where out holds an earlier choices.csv, logs
    the recordings it lacked and every earlier case whose choice changed (changed_choices)."""
    from experiments.accuracy import markdown_table, plot_accuracy, tables
    from experiments.common import REFERENCE_EXACT_RATE

    runs, folder_of = [], {}
    for folder in sorted(f for f in root.iterdir() if (f / "raw").is_dir()):
        for result in recordings(folder / "raw"):
            replanned = replan_file(result, without, check, repeated_only=True)
            if replanned is not None:
                label = f"{folder.name}/{result.stem}"
                runs.append((label, *replanned))
                folder_of[label] = folder.name
    if not runs:
        raise SystemExit(f"no repeated-truth evaluation with a whole profile under {root}")
    unseen = unseen_folders(root)
    unknown = unseen - set(folder_of.values())
    if unknown:
        raise SystemExit(f"{root / 'unseen.txt'} lists folders with no repeated-truth recording: {', '.join(sorted(unknown))}")
    groups = {"unseen": [label for label, folder in folder_of.items() if folder in unseen]} if unseen else {}
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


README_TABLE_MARKERS = ("<!-- choice-accuracy table: replanned-repeated/summary.md, written by experiments/replan.py "
                        "--all-repeated -->", "<!-- end of the choice-accuracy table -->")


def readme_with_table(readme: str, table: str) -> str:
    """The README with the text between README_TABLE_MARKERS replaced by ``table``, indented like the
    start marker (the table sits in a list item)."""
    start, end = README_TABLE_MARKERS
    if readme.count(start) != 1 or readme.count(end) != 1 or readme.index(start) > readme.index(end):
        raise SystemExit(f"the README needs the choice-accuracy table's markers once each: {start} ... {end}")
    head, rest = readme.split(start)
    indent = head[head.rfind("\n") + 1:]
    tail = rest.split(end)[1]
    body = "".join(f"{indent}{line}\n" if line else "\n" for line in table.splitlines())
    return f"{head}{start}\n{body}{indent}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", type=Path, default=RESULTS / "choice_accuracy" / "full")
    parser.add_argument("--to", type=Path, help="default: <from>/replanned[-without-<ablation>]")
    parser.add_argument("--all-repeated", action="store_true",
                        help="every repeated-truth run under results/choice_accuracy in one table "
                             "(default --to: results/choice_accuracy/replanned-repeated[-without-<ablation>])")
    ablation = parser.add_mutually_exclusive_group()
    ablation.add_argument("--without-startup", dest="without", action="store_const", const="startup",
                          help="plan without the measured start-up (ablation)")
    ablation.add_argument("--without-startup-power", dest="without", action="store_const", const="startup-power",
                          help="price the start-up at training power, as before it was measured (ablation)")
    ablation.add_argument("--without-sets", dest="without", action="store_const", const="sets",
                          help="plan from the solo runs alone, no calibration set (ablation)")
    ablation.add_argument("--without-rate-revision", dest="without", action="store_const", const="rate-revision",
                          help="keep the solo windows' rates, not revised by the sets (ablation)")
    parser.add_argument("--check", action="store_true",
                        help="fail unless the re-planned predictions equal the recorded ones (same planner)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    suffix = f"-without-{args.without}" if args.without else ""
    if args.all_repeated:
        root = RESULTS / "choice_accuracy"
        out = (args.to or root / f"replanned-repeated{suffix}").resolve()
        frames = rescore_repeated(root, out, args.without, args.check)
        log.info("summary:\n%s", frames["summary"].to_string(index=False))
        if args.to is None and args.without is None:   # the headline: the README shows its table
            readme = ROOT / "README.md"
            write_text_atomic(readme, readme_with_table(readme.read_text(), (out / "summary.md").read_text()))
            log.info("the README's choice-accuracy table now shows %s", out / "summary.md")
        log.info("results in %s", out)
        return 0
    from experiments.choice_accuracy import EXTRA, FULL, REDUCED, render

    settings = {s.model: s for s in FULL + REDUCED + EXTRA}
    out = (args.to or args.source / f"replanned{suffix}").resolve()
    done = []
    for result in recordings(args.source / "raw"):
        replanned = replan_file(result, args.without, args.check)
        if replanned is None:
            continue
        setting, new = replanned
        write_json(out / "raw" / result.name, new)
        write_json(out / "raw" / result.with_suffix(".setting.json").name, setting)
        done.append(settings[result.stem])
    if not done:
        raise SystemExit(f"no evaluation with a whole profile in {args.source / 'raw'}")
    frames = render(out, tuple(done))
    log.info("summary:\n%s", frames["summary"].to_string(index=False))
    log.info("results in %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well did pre-training's solo windows read the rate each device then trained at?

For every recorded evaluation with a repeated truth (experiments.recordings), per
device: the solo rate(s) pre-training measured (each window when it measured the device twice,
DeviceProfile.solo_rates_steps_per_s) against the steady rate of each training of that device
alone. Evaluations recorded since the harness keeps each worker's steady rate
(``runs[].steady_steps_per_s``) are read directly; older ones are estimated as the run's steps
over its time less the start-up pre-training measured (``~`` marks those). Then, for the fastest
device, the ratio a time choice hinges on: the throughput of the fastest device with each other
device over the fastest alone, as today's planner predicts it and as the trainings measured it.
Last, the other devices' solo windows by how many steps they held (a heavy model's slow device is
timed over a handful of steps past its warm-up), alone and against the fastest device of the same
recording (what moves a ranking between the fastest alone and the fastest with others); only
devices whose trainings recorded their steady rate. And the whole job of the fastest device with
its best partner (the pair whose trainings took the least time, mean over the rounds) against the
fastest alone, predicted and trained: where a time choice between the two is decided; and the
same for every partner, since the best one, picked by the trainings it is scored against, is the
one whose trainings happened to run fast (by whether the fastest device is the server). And, for
profiles that keep each solo window's step completions (``solo_window_ends_s``) and windows of
more than FEW_WINDOW_STEPS steps, the same run read over its first SHORT_WINDOW_STEPS steps only:
what a short window would have read, paired with the whole window on the same run. And each member of
each calibration set: its rate in the set (its steps there over the set's window) against its steady
rate when that same configuration trained, by how many steps it took in the set (a slow member of a
short set is timed over a handful of steps, as a slow device's short solo window is).

    .venv/bin/python -m experiments.investigations.solo_rates [--from PATH ...]

No training: it reads the recordings dataset (results/choice_accuracy/recordings.parquet, or --from:
other datasets, results folders or folders of them), re-fits the planner on each profile and prints.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from experiments.recordings import DATASET, Recording, load

FEW_WINDOW_STEPS = 8   # a solo window of this many steps or fewer is "short" in the summary
SHORT_WINDOW_STEPS = 5  # the paired comparison: a long window's first steps, as a short window would have held


def repeated_recordings(sources: list[Path] | None = None) -> list[Recording]:
    """The counted recordings with a repeated truth and a profile of ``sources`` (each the dataset,
    a results folder or a folder of them; default the dataset)."""
    return [r for source in sources or [DATASET] for r in load(source)
            if not r.left_out and "profile" in r.evaluation and r.repeated]


def steady_rate(run: dict[str, Any], device: str, remaining_steps: int, startup_s: float) -> tuple[float, bool]:
    """(rate, measured): the run's own steady rate of ``device`` when recorded, else an estimate."""
    recorded = run.get("steady_steps_per_s", {}).get(device)
    if recorded:
        return recorded, True
    return remaining_steps / max(run["time_s"] - startup_s, 1e-9), False


def report(recording: Recording) -> dict[str, Any]:
    from hetcluster.planner import FittedModels, plan
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    data, total = recording.evaluation, recording.total_steps
    profile = Profile.from_dict(data["profile"])
    remaining = total - profile.pretrain_steps
    runs = {frozenset(c["devices"]): c.get("runs") or [] for c in data["configurations"]}
    devices, planner_runs, job = to_planner_inputs(profile, total)
    models = FittedModels.fit(devices, planner_runs, job)
    units = models.throughput.measured_units()
    revised = dict(zip(units.labels, units.rate_steps_per_s)) if not units.is_classes else {}
    lines, errors, window_steps, spreads, first_steps = [], {}, {}, [], {}
    for device in profile.devices:
        windows = device.solo_rates_steps_per_s or [device.steps_per_s]
        trained = [
            steady_rate(r, device.name, remaining, device.startup_s) for r in runs.get(frozenset([device.name]), [])
        ]
        if not trained:
            continue
        mean = statistics.fmean(rate for rate, _ in trained)
        errors[device.name] = device.steps_per_s / mean - 1
        ends = device.solo_window_ends_s[0] if device.solo_window_ends_s else []
        if len(ends) > FEW_WINDOW_STEPS and not device.measured_on:  # what its first steps alone read
            first_steps[device.name] = (SHORT_WINDOW_STEPS / ends[SHORT_WINDOW_STEPS - 1] / mean - 1,
                                        len(ends) / ends[-1] / mean - 1)
        if all(measured for _, measured in trained):  # the summary leaves estimated rates out
            window_steps[device.name] = device.steps
            if len(trained) >= 2 and device.name in revised:
                spreads.append((math.log(device.steps_per_s / mean), math.log(revised[device.name] / mean),
                                math.log(trained[0][0] / trained[1][0])))
        lines.append(
            f"  {device.name:14s} solo {' / '.join(f'{w:.2f}' for w in windows)}"
            f"{f' (pooled {device.steps_per_s:.2f})' if len(windows) > 1 else ''}"
            f"  trained {', '.join(f'{r:.2f}' if m else f'~{r:.2f}' for r, m in trained)}"
            f"  pre-training off by {errors[device.name]:+.0%}"
            + (f" (revised by the sets {revised[device.name] / mean - 1:+.0%})" if device.name in revised else "")
            + (
                f"; its first {SHORT_WINDOW_STEPS} steps {first_steps[device.name][0]:+.0%}, its first window "
                f"({len(ends)} steps) {first_steps[device.name][1]:+.0%}"
                if device.name in first_steps
                else ""
            )
        )
    table = plan(devices, planner_runs, job, "edp", (), models=models).table
    predicted = {frozenset(row["devices"]): row["steps_per_s"] for row in table.to_dict("records")}
    fastest = max(profile.devices, key=lambda d: d.steps_per_s)
    alone = runs.get(frozenset([fastest.name]), [])
    ratios = []
    if alone:
        alone_rate = statistics.fmean(steady_rate(r, fastest.name, remaining, fastest.startup_s)[0] for r in alone)
        for other in profile.devices:
            pair = frozenset([fastest.name, other.name])
            if other is fastest or not runs.get(pair):
                continue
            measured = statistics.fmean(sum(r.get("steady_steps_per_s", {}).values()) or r["steps_per_s"]
                                        for r in runs[pair]) / alone_rate
            ratio = predicted[pair] / predicted[frozenset([fastest.name])]
            ratios.append(ratio / measured - 1)
            lines.append(f"  {fastest.name}+{other.name} over {fastest.name} alone: predicted {ratio:.2f}, "
                         f"trained {measured:.2f} ({ratio / measured - 1:+.0%})")
    pair_gains = _pair_gains(data["configurations"], table, fastest.name)
    best_pair = min(pair_gains, key=lambda g: g[1]) if pair_gains else None
    if best_pair:
        partner, trained_gain, predicted_gain = best_pair
        lines.append(
            f"  whole job, {fastest.name}+{partner} over {fastest.name} alone: predicted {predicted_gain:+.2%}, "
            f"trained {trained_gain:+.2%}"
        )
    fastest_error = errors.get(fastest.name)
    others = [(window_steps[name], error, None if fastest_error is None else error - fastest_error)
              for name, error in errors.items() if name != fastest.name and name in window_steps]
    paired = [first_steps[name] for name in first_steps if name != fastest.name and name in window_steps]
    set_members = [member for run in data["profile"].get("runs", []) for member in _set_members(run, runs)]
    return {"name": recording.label, "lines": lines, "fastest_error": fastest_error,
            "ratio_errors": ratios, "others": others, "best_pair": best_pair, "pair_gains": pair_gains,
            # the fastest device's class (a 'server*2' fleet names its members server-1, server-2);
            # profiles recorded before device_class carry none: the name is the class then
            "fastest_class": fastest.device_class or fastest.name, "spreads": spreads, "paired": paired,
            "set_members": set_members}


def _set_members(run: dict[str, Any], trainings: dict[frozenset, list[dict[str, Any]]]) -> list[tuple[float, float]]:
    """(steps in the set, rate in the set over the mean steady rate in the trainings of the same
    configuration, less one) of each member of one calibration set; only members whose every
    training of that configuration recorded their steady rate, and only with two or more trainings."""
    trained = trainings.get(frozenset(run["devices"]), [])
    if len(run["devices"]) < 2 or len(trained) < 2 or run.get("time_s", 0) <= 0:
        return []
    members = []
    for name, steps in run.get("per_device_steps", {}).items():
        rates = [t.get("steady_steps_per_s", {}).get(name) for t in trained]
        if steps > 0 and all(rates):
            members.append((steps, steps / run["time_s"] / statistics.fmean(rates) - 1))
    return members


def _pair_gains(configurations: list[dict[str, Any]], table, fastest: str) -> list[tuple[str, float, float]]:
    """(partner, trained gain, predicted gain) of every pair of the fastest device with another,
    by the trainings' mean whole-job time; a gain is the pair's time over the fastest alone's, less
    one (negative: the pair is faster). Empty without repeated trainings of the fastest alone."""
    trained = {frozenset(c["devices"]): statistics.fmean(m["time_s"] for m in c["repeats"])
               for c in configurations if c.get("repeats")}
    alone = frozenset([fastest])
    if alone not in trained:
        return []
    predicted = {frozenset(row["devices"]): row["time_s"] for row in table.to_dict("records")}
    pairs = sorted((k for k in trained if len(k) == 2 and fastest in k), key=sorted)
    return [
        (next(iter(k - alone)), trained[k] / trained[alone] - 1, predicted[k] / predicted[alone] - 1) for k in pairs
    ]


def _gain_errors(label: str, reports: list[dict[str, Any]]) -> str | None:
    """One line: predicted minus trained whole-job gain (points) of every partner of the fastest
    device alone, then of the best partner and of the others apart, over ``reports``."""
    every = [100 * (g[2] - g[1]) for r in reports for g in r["pair_gains"]]
    if not every:
        return None
    best = [100 * (r["best_pair"][2] - r["best_pair"][1]) for r in reports if r["best_pair"]]
    rest = [100 * (g[2] - g[1]) for r in reports for g in r["pair_gains"] if g is not r["best_pair"]]

    def median(values: list[float]) -> str:
        return (
            f"{statistics.median(values):+.2f} ({sum(v > 0 for v in values)} of {len(values)} above 0)"
            if values
            else "-"
        )

    return (f"every partner of the fastest alone, {label} (whole job), predicted minus trained gain in points: "
            f"median {median(every)}; the best partner {median(best)}, the others {median(rest)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="sources", type=Path, nargs="*",
                        help=f"the dataset, results folders or folders of them (default: {DATASET})")
    args = parser.parse_args(argv)
    reports = [report(recording) for recording in repeated_recordings(args.sources)]
    for r in reports:
        print(r["name"])
        print("\n".join(r["lines"]))
    fastest = [r["fastest_error"] for r in reports if r["fastest_error"] is not None]
    ratios = [e for r in reports for e in r["ratio_errors"]]
    if fastest:
        print(f"fastest device's solo rate against its trainings: median |error| "
              f"{statistics.median(abs(e) for e in fastest):.0%} over {len(fastest)} recordings, "
              f"{sum(abs(e) >= 0.10 for e in fastest)} of them off by 10 % or more")
    if ratios:
        print(f"pair over fastest alone, predicted against trained: median {statistics.median(ratios):+.1%}, "
              f"{sum(e < 0 for e in ratios)} of {len(ratios)} under-predicted")
    gains = [r["best_pair"] for r in reports if r["best_pair"]]
    if gains:
        faster = [g for g in gains if g[1] < 0]
        differences = [g[2] - g[1] for g in gains]
        print(f"fastest with its best partner against the fastest alone (whole job): trained faster in "
              f"{len(faster)} of {len(gains)}, predicted faster in {sum(g[2] < 0 for g in faster)} of those and in "
              f"{sum(g[2] < 0 <= g[1] for g in gains)} where it was not; predicted minus trained: mean "
              f"{100 * statistics.fmean(differences):+.2f} points, median {100 * statistics.median(differences):+.2f}")
    for label, server in (("the server fastest", True), ("a board fastest", False)):
        line = _gain_errors(label, [r for r in reports if (r["fastest_class"] == "server") == server])
        if line:
            print(line)
    spreads = [s for r in reports for s in r["spreads"]]
    if spreads:
        window, revised, rounds = (math.sqrt(statistics.fmean(s[k] ** 2 for s in spreads)) for k in range(3))
        print(
            f"solo rates against the mean of the device's trainings alone, RMS log-error over {len(spreads)} devices: "
            f"the window {window:.3f}, revised by the sets {revised:.3f} "
            f"({sum(abs(s[0]) >= 0.10 for s in spreads)} and {sum(abs(s[1]) >= 0.10 for s in spreads)} off by 10 % or "
            "more); "
            f"one training against the other {rounds:.3f} (the run-to-run spread: {rounds / math.sqrt(2):.3f} per run, "
            f"so one run read as well as a training would be {rounds / math.sqrt(2) * math.sqrt(1.5):.3f} off the "
            "mean of two)"
        )
    others = [o for r in reports for o in r["others"]]
    for short in (True, False):
        chosen = [o for o in others if (o[0] <= FEW_WINDOW_STEPS) == short]
        if not chosen:
            continue
        relative = [o[2] for o in chosen if o[2] is not None]
        label = f"{'<=' if short else '>'} {FEW_WINDOW_STEPS} steps"
        print(f"other devices' solo windows of {label}: median {statistics.median(o[1] for o in chosen):+.1%} "
              f"against their trainings over {len(chosen)}"
              + (f"; minus the fastest's error in the same recording: median {statistics.median(relative):+.1%}, "
                 f"{sum(e < 0 for e in relative)} of {len(relative)} below" if relative else ""))
    paired = [p for r in reports for p in r["paired"]]
    if paired:  # the same runs read over fewer steps: no recording-to-recording difference in it
        print(
            f"other devices' solo windows of more than {FEW_WINDOW_STEPS} steps with their completions recorded, "
            f"over {len(paired)}: the first {SHORT_WINDOW_STEPS} steps read a median "
            f"{statistics.median(p[0] for p in paired):+.1%} against their trainings ({sum(p[0] < 0 for p in paired)} "
            "below), "
            f"the whole first window {statistics.median(p[1] for p in paired):+.1%} ({sum(p[1] < 0 for p in paired)} "
            "below); "
            f"the first steps slower than the whole window in {sum(p[0] < p[1] for p in paired)}"
        )
    members = [m for r in reports for m in r["set_members"]]
    for short in (True, False):
        chosen = [m[1] for m in members if (m[0] <= FEW_WINDOW_STEPS) == short]
        if chosen:
            print(f"calibration sets' members with {'<=' if short else '>'} {FEW_WINDOW_STEPS} steps in the set, over "
                  f"{len(chosen)}: rate in the set against the same configuration's trainings, median "
                  f"{statistics.median(chosen):+.1%} ({sum(e < 0 for e in chosen)} below)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

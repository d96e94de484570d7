"""Choice accuracy of pre-training on lanes against the sequential protocol, on the same cases.

Each case is a fleet and a job, chosen before any was run (``CASES``). The fleet comes up once;
`hetcluster profile --pretrain-protocol lanes` writes the new protocol's profile, and `hetcluster
evaluate --repeats 2 --pretrain-protocol sequential` the old one's profile and choices together
with the two-round truth (every configuration trained twice, from the old profile's checkpoint);
the order of the two alternates from case to case. The lanes profile is then planned for the job
the truth trained (``score_case``, ``experiments.replan.replan``), so both protocols are scored on
the same trainings, under every objective. Every device is measured in each run (no known
devices). --rescore scores the raw outputs --out-dir holds again, running nothing.

    .venv/bin/python -m experiments.pretrain_protocols [--cases A,B] [--out-dir DIR] [--rescore]

Prints, per case and objective, whether the truth separates its best and whether each protocol's
choice is exact; then both protocols' exact counts over the separated cases and over all, and the
pre-training seconds of each. Writes ``results.json`` (the rows) and each case's raw outputs under
--out-dir (default experiments/results/pretrain_protocols; only results.json is kept in the
repository). It trains for about a quarter of an hour per case: run it with nothing else on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from experiments.common import RESULTS, emulated_fleet, run_cli, write_json

# case → (devices, model, input shape, batch size, total steps); none is `make demo`'s job or the
# jetson-xavier, rpi4, phone mobilenet_v2 job of benchmarks/pretraining_cost.py
CASES: dict[str, tuple[str, str, str, int, int]] = {
    "A": ("jetson-xavier,jetson-nano,rpi4", "small_cnn", "32x32x3", 32, 800),
    "B": ("server,jetson-tx2,phone", "small_cnn", "32x32x3", 16, 1500),
    "C": ("server,jetson-xavier,jetson-tx2", "mobilenet_v2", "32x32x3", 8, 200),
    "D": ("jetson-tx2,rpi4,phone", "small_cnn", "32x32x3", 32, 600),
    "E": ("server,jetson-nano,phone", "small_cnn", "32x32x3", 16, 800),
    "F": ("jetson-xavier,jetson-tx2,rpi4", "small_cnn", "32x32x3", 32, 500),
    "G": ("server,jetson-xavier,phone", "mobilenet_v2", "32x32x3", 8, 150),
    "H": ("jetson-xavier,jetson-nano,jetson-tx2", "small_cnn", "32x32x3", 64, 400),
}
OBJECTIVES = ("time", "power", "energy", "edp")


def run_case(name: str, out: Path, first: str) -> list[dict[str, Any]]:
    devices, model, shape, batch, total = CASES[name]
    job = ["--model", model, "--input-shape", shape, "--classes", "10", "--batch-size", str(batch),
           "--total-steps", str(total), "--remeasure"]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, \
            emulated_fleet(Path(tmp) / "state", devices.split(","), f"pp{name.lower()}", log_path=folder / "cli.log") \
            as inventory:
        def lanes() -> None:
            run_cli(["profile", "--inventory", inventory, *job, "--workdir", folder / "lanes",
                     "--pretrain-protocol", "lanes"], folder / "cli.log")

        def sequential() -> None:
            run_cli(["evaluate", "--inventory", inventory, *job, "--workdir", folder / "sequential", "--repeats", "2",
                     "--pretrain-protocol", "sequential", "--out", folder / "evaluation.json"], folder / "cli.log")

        for step in ((lanes, sequential) if first == "lanes" else (sequential, lanes)):
            step()
    return score_case(name, folder)


def score_case(name: str, folder: Path) -> list[dict[str, Any]]:
    """Both protocols' choices for one case whose raw outputs are in ``folder``. The lanes profile
    is planned for the job the truth trained: the steps left after the sequential pre-training (the
    truth's checkpoint), with its seconds and energy; its own shorter pre-training would plan
    another job, whose truth nobody measured."""
    from experiments.replan import replan

    devices, model, _shape, _batch, total = CASES[name]
    evaluation = json.loads((folder / "evaluation.json").read_text())
    lanes_profile = json.loads((folder / "lanes" / "profile.json").read_text())
    truths_job = {key: evaluation["profile"][key] for key in ("pretrain_steps", "pretrain_time_s", "pretrain_energy_j")}
    new = replan({**evaluation, "profile": {**lanes_profile, **truths_job}}, total)
    rows = []
    for objective in OBJECTIVES:
        old, mine = evaluation["objectives"][objective], new["objectives"][objective]
        rows.append({"case": name, "devices": devices, "model": model, "objective": objective,
                     "separated": old.get("separated"), "best": old["best"],
                     "sequential_chosen": old["chosen"], "sequential_exact": old["exact"],
                     "lanes_chosen": mine["chosen"], "lanes_exact": mine["exact"],
                     "sequential_pretrain_s": evaluation["pretrain"]["time_s"],
                     "lanes_pretrain_s": lanes_profile["pretrain_time_s"]})
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    separated = [r for r in rows if r["separated"]]
    lines = [f"{r['case']} {r['objective']:>6}: separated {str(bool(r['separated'])):5}  "
             f"sequential {'exact' if r['sequential_exact'] else 'wrong':5} {'+'.join(r['sequential_chosen'])}  "
             f"lanes {'exact' if r['lanes_exact'] else 'wrong':5} {'+'.join(r['lanes_chosen'])}  "
             f"(best {'+'.join(r['best'])})" for r in rows]
    for label, chosen in (("separated cases", separated), ("all cases", rows)):
        lines.append(f"{label}: {len(chosen)}; exact: sequential {sum(bool(r['sequential_exact']) for r in chosen)}, "
                     f"lanes {sum(bool(r['lanes_exact']) for r in chosen)}")
    cases = {r["case"]: r for r in rows}.values()
    lines.append("pre-training seconds per case (sequential → lanes): " + ", ".join(
        f"{r['case']} {r['sequential_pretrain_s']:.0f} → {r['lanes_pretrain_s']:.0f}" for r in cases))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out-dir", type=Path, default=RESULTS / "pretrain_protocols")
    parser.add_argument("--rescore", action="store_true",
                        help="score the cases whose raw outputs --out-dir holds again, running nothing")
    args = parser.parse_args(argv)
    if args.rescore:
        rows = [row for name in args.cases.split(",") if (args.out_dir / name / "evaluation.json").exists()
                for row in score_case(name, args.out_dir / name)]
        write_json(args.out_dir / "results.json", rows)
        print(summary(rows))
        return 0
    os.environ["HETCLUSTER_MEASUREMENTS"] = "off"
    results = args.out_dir / "results.json"
    rows = json.loads(results.read_text()) if results.exists() else []
    done = {r["case"] for r in rows}
    for index, name in enumerate(args.cases.split(",")):
        if name in done:
            continue
        rows += run_case(name, args.out_dir, "lanes" if index % 2 == 0 else "sequential")
        write_json(results, rows)
        print(summary(rows), flush=True)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every recorded ground truth of choice accuracy in one file, results/choice_accuracy/recordings.parquet.

A recording is what `hetcluster evaluate` wrote for one model on one fleet, through
experiments.choice_accuracy: ``<results folder>/raw/<model>.json`` (the pre-training profile beside
every configuration's predicted and measured time, power and energy, each training kept) and
``<model>.setting.json`` (the job, and what else the host ran meanwhile). The dataset keeps both
whole, one row per recording, so experiments.replan and the investigations re-plan from one file.
Its columns are described in results/choice_accuracy/README.md.

    .venv/bin/python -m experiments.recordings add experiments/results/choice_accuracy/<folder> [--unseen |
    --left-out REASON]
    .venv/bin/python -m experiments.recordings list
    .venv/bin/python -m experiments.recordings export FOLDER/MODEL ... --to DIR

``add`` puts a new results folder's recordings into the dataset (replacing the folder's earlier
rows); the folder itself can then go. ``export`` writes recordings back as DIR/<folder>/raw/, for a
tool that reads a results folder (experiments.replan --from). Every loader here also reads a results
folder with ``raw/``, or a root of such folders, the way a recording is first written (and the
tests' copies are kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from experiments.common import RESULTS, read_json, write_json

DATASET = RESULTS / "choice_accuracy" / "recordings.parquet"
COLUMNS = ("folder", "model", "unseen", "left_out", "repeated", "whole_profile", "devices", "configurations",
           "total_steps", "git_commit", "evaluation", "setting")


def repeated_truth(evaluation: dict[str, Any]) -> bool:
    """Whether every configuration of an evaluation was trained more than once."""
    return all(len(c.get("repeats", [])) > 1 for c in evaluation["configurations"])


@dataclasses.dataclass(frozen=True)
class Recording:
    """One `hetcluster evaluate` recording: ``folder`` is the results folder it was written into,
    ``unseen`` says its fleet and model were chosen before any of its results were seen, and
    ``left_out`` (empty when counted) why no headline counts it."""

    folder: str
    model: str
    evaluation: dict[str, Any]
    setting: dict[str, Any]
    unseen: bool = False
    left_out: str = ""

    @property
    def label(self) -> str:
        return f"{self.folder}/{self.model}"

    @property
    def total_steps(self) -> int:
        return int(self.setting["total_steps"])

    @property
    def whole_profile(self) -> bool:
        """Recorded since evaluate keeps the whole pre-training profile, so it can be re-planned."""
        return "format_version" in self.evaluation.get("profile", {})

    @property
    def repeated(self) -> bool:
        return repeated_truth(self.evaluation)

    @property
    def scored(self) -> bool:
        """Whether the headline (experiments.replan --all-repeated) scores it."""
        return not self.left_out and self.whole_profile and self.repeated

    def row(self) -> dict[str, Any]:
        configurations = self.evaluation["configurations"]
        fleet = max((c["devices"] for c in configurations), key=len, default=[])
        return {"folder": self.folder, "model": self.model, "unseen": self.unseen, "left_out": self.left_out,
                "repeated": self.repeated, "whole_profile": self.whole_profile, "devices": "+".join(fleet),
                "configurations": len(configurations), "total_steps": self.total_steps,
                "git_commit": self.setting.get("machine_after", {}).get("git_commit", ""),
                "evaluation": json.dumps(self.evaluation), "setting": json.dumps(self.setting)}


def raw_files(raw_dir: Path) -> list[Path]:
    """The evaluations (raw/<model>.json beside its .setting.json) of one results folder."""
    return [r for r in sorted(Path(raw_dir).glob("*.json"))
            if not r.name.endswith(".setting.json") and r.with_suffix(".setting.json").exists()]


def in_folder(folder: Path, unseen: bool = False, left_out: str = "") -> list[Recording]:
    """The recordings of one results folder (folder/raw/<model>.json)."""
    folder = Path(folder)
    return [Recording(folder.name, raw.stem, read_json(raw), read_json(raw.with_suffix(".setting.json")),
                      unseen, left_out) for raw in raw_files(folder / "raw")]


def read(path: Path = DATASET) -> list[Recording]:
    """The recordings of the dataset, in its order (by folder, then model)."""
    import pandas as pd

    frame = pd.read_parquet(path, columns=["folder", "model", "unseen", "left_out", "evaluation", "setting"])
    return [Recording(row["folder"], row["model"], json.loads(row["evaluation"]), json.loads(row["setting"]),
                      bool(row["unseen"]), row["left_out"]) for row in frame.to_dict("records")]


def load(source: Path = DATASET) -> list[Recording]:
    """The recordings of ``source``: the dataset (a .parquet file), one results folder (with raw/),
    or a root of such folders (each one's, by folder name)."""
    source = Path(source)
    if source.suffix == ".parquet":
        return read(source)
    if (source / "raw").is_dir():
        return in_folder(source)
    if not source.is_dir():
        raise SystemExit(f"{source}: neither a .parquet dataset nor a folder of recordings")
    return [r for folder in sorted(f for f in source.iterdir() if (f / "raw").is_dir()) for r in in_folder(folder)]


def write(recordings: Iterable[Recording], path: Path = DATASET) -> Path:
    """The dataset of ``recordings``, sorted by folder and then model (the order replan scores them
    in), written atomically."""
    import pandas as pd

    from hetcluster.fileio import write_atomic

    ordered = sorted(recordings, key=lambda r: (r.folder, f"{r.model}.json"))
    labels = [r.label for r in ordered]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"recordings named twice: {sorted({x for x in labels if labels.count(x) > 1})}")
    frame = pd.DataFrame([r.row() for r in ordered], columns=list(COLUMNS))
    write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False, compression="zstd"))
    return Path(path)


def add(folder: Path, path: Path = DATASET, unseen: bool = False, left_out: str = "") -> list[Recording]:
    """The dataset with ``folder``'s recordings in place of any earlier ones of the same folder name."""
    new = in_folder(folder, unseen, left_out)
    if not new:
        raise SystemExit(f"no recording in {Path(folder) / 'raw'} (raw/<model>.json beside its .setting.json)")
    kept = [r for r in read(path) if r.folder != Path(folder).name] if Path(path).exists() else []
    write(kept + new, path)
    return new


def export(recordings: Iterable[Recording], to: Path) -> list[Path]:
    """Each recording as experiments.choice_accuracy wrote it: to/<folder>/raw/<model>.json and
    .setting.json. Returns the results folders."""
    folders = []
    for r in recordings:
        raw = Path(to) / r.folder / "raw"
        write_json(raw / f"{r.model}.json", r.evaluation)
        write_json(raw / f"{r.model}.setting.json", r.setting)
        folders.append(raw.parent)
    return sorted(set(folders))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=DATASET)
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="put a results folder's recordings into the dataset")
    adding.add_argument("folders", type=Path, nargs="+", help="results folders, each with raw/<model>.json")
    flags = adding.add_mutually_exclusive_group()
    flags.add_argument("--unseen", action="store_true",
                       help="the fleet and model were chosen before any of their results were seen")
    flags.add_argument("--left-out", default="", metavar="REASON", help="kept, but counted by no headline")
    commands.add_parser("list", help="one line per recording")
    exporting = commands.add_parser("export", help="write recordings back as DIR/<folder>/raw/")
    exporting.add_argument("labels", nargs="+", metavar="FOLDER/MODEL")
    exporting.add_argument("--to", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "add":
        for folder in args.folders:
            for recording in add(folder, args.dataset, args.unseen, args.left_out):
                print(f"added {recording.label}")
        return 0
    if args.command == "export":
        by_label = {r.label: r for r in read(args.dataset)}
        unknown = [label for label in args.labels if label not in by_label]
        if unknown:
            raise SystemExit(f"not in {args.dataset}: {', '.join(unknown)}")
        for folder in export([by_label[label] for label in args.labels], args.to):
            print(folder)
        return 0
    for r in read(args.dataset):
        flags_of = ["repeated" if r.repeated else "once", *(["unseen"] if r.unseen else []),
                    *([f"left out: {r.left_out}"] if r.left_out else [])]
        print(f"{r.label}  {', '.join(flags_of)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

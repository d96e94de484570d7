"""Shared by the tests of the re-planning experiments (replan, set_value, measurement_bound, solo_rates):
copies of a few choice-accuracy recordings, kept as test data in tests/data/choice_accuracy/ (the
layout experiments.choice_accuracy writes: <folder>/raw/<model>.json beside its .setting.json)."""

from __future__ import annotations

import shutil
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "data" / "choice_accuracy"


def copy_recordings(root: Path, recordings: tuple[tuple[str, str], ...]) -> Path:
    """root/<folder>/raw/<model>.json and .setting.json copied from RESULTS for each (folder, model)."""
    for folder, model in recordings:
        raw = root / folder / "raw"
        raw.mkdir(parents=True)
        for name in (f"{model}.json", f"{model}.setting.json"):
            shutil.copy(RESULTS / folder / "raw" / name, raw / name)
    return root

"""experiments/replan.py: today's planner re-scored on a recorded ground truth, and its ablations.

Uses a committed recording (the five-device run: profile + 31 configurations each trained twice),
so the re-planning path is checked on what a real run left, not on a hand-made dict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import replan  # noqa: E402

RECORDING = EXPERIMENTS / "results" / "choice_accuracy" / "full-x4-r2-5dev" / "raw" / "small_cnn.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDING.read_text())


def _predicted(evaluation: dict) -> dict[frozenset, float]:
    return {frozenset(c["devices"]): c["predicted"]["time_s"] for c in evaluation["configurations"]}


def test_without_sets_keeps_solo_predictions_and_changes_the_multi_device_ones(recorded) -> None:
    with_sets = replan.replan(recorded, 2000)
    without = replan.replan(recorded, 2000, without="sets")
    before, after = _predicted(with_sets), _predicted(without)
    solo = [k for k in before if len(k) == 1]
    multi = [k for k in before if len(k) > 1]
    assert len(solo) == 5 and len(multi) == 26
    assert all(after[k] == pytest.approx(before[k], rel=1e-12) for k in solo)   # no set enters a solo prediction
    assert sum(after[k] != pytest.approx(before[k], rel=1e-6) for k in multi) >= 20
    assert [c["measured"] for c in without["configurations"]] == [c["measured"] for c in with_sets["configurations"]]


def test_repeated_truth_is_scored_for_separation(recorded) -> None:
    objectives = replan.replan(recorded, 2000)["objectives"]
    assert {name: score["separated"] for name, score in objectives.items()} == \
        {"time": True, "power": True, "energy": True, "edp": True}


def test_all_repeated_rescores_only_repeated_truths_in_one_table(tmp_path) -> None:
    import shutil

    results = EXPERIMENTS / "results" / "choice_accuracy"
    for folder, model in (("full-x4-r2-5dev", "small_cnn"), ("full", "small_cnn")):   # twice-trained, once-trained
        raw = tmp_path / "root" / folder / "raw"
        raw.mkdir(parents=True)
        for name in (f"{model}.json", f"{model}.setting.json"):
            shutil.copy(results / folder / "raw" / name, raw / name)
    frames = replan.rescore_repeated(tmp_path / "root", tmp_path / "out")
    assert set(frames["choices"]["model"]) == {"full-x4-r2-5dev/small_cnn"}   # the once-trained truth is left out
    summary = frames["summary"].set_index("scope")
    assert summary.loc["all", "cases"] == 4 and summary.loc["all", "separated_cases"] == 4
    assert summary.loc["all", "exact"] == pytest.approx(1.0)
    assert (tmp_path / "out" / "summary.csv").exists() and (tmp_path / "out" / "accuracy.png").exists()

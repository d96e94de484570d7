"""experiments/investigations/set_value.py: the planner's choices with fewer of the recorded calibration
sets, and with a second set picked after a first plan, on a recorded truth (the five-device run)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
from recorded_truths import RESULTS, copy_recordings

from experiments import replan
from experiments.investigations import set_value

RECORDING = RESULTS / "full-x4-r2-5dev" / "raw" / "small_cnn.json"


def _chosen(evaluation: dict) -> dict[str, str]:
    return {name: "+".join(sorted(score["chosen"])) for name, score in evaluation["objectives"].items()}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> pd.DataFrame:
    root = copy_recordings(tmp_path_factory.mktemp("recordings"),
                           (("full-x4-r2-5dev", "small_cnn"), ("full", "small_cnn")))   # twice-trained, once-trained
    out = root / "out"
    assert set_value.main(["--recordings", str(root), "--out", str(out)]) == 0
    assert (out / "summary.csv").exists()
    return pd.read_csv(out / "cases.csv").set_index("objective")


def test_only_repeated_truths_are_scored_one_row_per_objective(cases) -> None:
    assert list(cases.index) == ["time", "power", "energy", "edp"]
    assert set(cases["recording"]) == {"full-x4-r2-5dev/small_cnn"} and (cases["sets"] == 3).all()


def test_no_set_chooses_as_replan_without_sets_does(cases) -> None:
    recorded = json.loads(RECORDING.read_text())
    assert cases["none chose"].to_dict() == _chosen(replan.replan(recorded, 2000, without="sets"))
    assert cases["all"].all()   # with every set, this recording's headline: 4 of 4 exact


def test_the_first_set_alone_chooses_as_a_profile_holding_only_it(cases) -> None:
    trimmed = copy.deepcopy(json.loads(RECORDING.read_text()))
    trimmed["profile"]["runs"] = trimmed["profile"]["runs"][:1]
    assert cases["first 1 chose"].to_dict() == _chosen(replan.replan(trimmed, 2000))


def test_adaptive_keeps_the_first_plan_where_it_adds_no_set(cases) -> None:
    kept = cases[~cases["adaptive_added_set"]]
    assert (kept["adaptive chose"] == kept["first 1 chose"]).all()
    summary = set_value.summary(cases.reset_index()).set_index("scope")
    assert summary.loc["all", "cases"] == 4 and summary.loc["all", "all"] == 4
    assert summary.loc["all", "adaptive_added_set"] == int(cases["adaptive_added_set"].sum())

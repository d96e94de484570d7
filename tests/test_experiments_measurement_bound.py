"""experiments/investigations/measurement_bound.py: the planner fed one training round's own
measurements in place of pre-training's windows, scored against the other round, on a recorded truth
(residual CNN on four devices of the third catalog)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from recorded_truths import RESULTS, copy_recordings

from experiments import replan
from experiments.investigations import measurement_bound

FOLDER, MODEL, TOTAL_STEPS = "full-x2-r2-residual-untuned3-4", "residual_l2_cnn", 600
RECORDING = RESULTS / FOLDER / "raw" / f"{MODEL}.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDING.read_text())


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> pd.DataFrame:
    root = copy_recordings(tmp_path_factory.mktemp("recordings"),
                           ((FOLDER, MODEL), ("full-x4-r2-5dev", "small_cnn")))   # with worker rates, without
    out = root / "out"
    assert measurement_bound.main(["--recordings", str(root), "--out", str(out)]) == 0
    assert (out / "summary.csv").exists()
    return pd.read_csv(out / "cases.csv")


def test_a_row_per_objective_and_scored_round_only_for_recordings_with_worker_rates(cases) -> None:
    assert len(cases) == 8 and set(cases["recording"]) == {f"{FOLDER}/{MODEL}"}
    assert sorted(zip(cases["round"], cases["objective"])) == sorted((k, o) for k in (0, 1)
                                                                    for o in ("time", "power", "energy", "edp"))


def test_pretraining_chooses_as_today_s_planner_and_round_o_is_the_other_round_s_best(cases, recorded) -> None:
    replanned = replan.replan(recorded, TOTAL_STEPS)["objectives"]
    for row in cases.to_dict("records"):
        assert row["pretraining chose"] == "+".join(sorted(replanned[row["objective"]]["chosen"]))
        other_best = measurement_bound.round_best(recorded, 1 - row["round"], row["objective"])
        assert row["round o chose"] == "+".join(sorted(other_best))
        assert row["best"] == "+".join(sorted(measurement_bound.round_best(recorded, row["round"], row["objective"])))
        assert row["round o"] == (row["round o chose"] == row["best"])


def test_solo_runs_reproduce_the_round_s_solo_training_phases(recorded) -> None:
    from hetcluster.planner import FittedModels, plan

    devices, runs, job = measurement_bound.inputs_from_round(recorded, TOTAL_STEPS, 1, "solo runs")
    models = FittedModels.fit(devices, runs, job, revise_rates=False)   # as measurement_bound.choices fits it
    table = plan(devices, runs, job, "time", (), models=models).table
    predicted = {frozenset(d): t - job.pretrain_time_s for d, t in zip(table["devices"], table["time_s"])}
    for config in recorded["configurations"]:
        if len(config["devices"]) == 1:
            assert predicted[frozenset(config["devices"])] == pytest.approx(config["runs"][1]["time_s"], rel=1e-6)


def test_sets_take_the_round_s_member_rates_over_their_own_window(recorded) -> None:
    _, before, _ = measurement_bound.inputs_from_round(recorded, TOTAL_STEPS, 0, "solo runs")
    _, after, _ = measurement_bound.inputs_from_round(recorded, TOTAL_STEPS, 0, "solo runs and sets")
    trained = {frozenset(c["devices"]): c["runs"][0]["steady_steps_per_s"] for c in recorded["configurations"]}
    assert len(after) == len(before) == 3
    for old, new in zip(before, after):
        rates = trained[frozenset(new.devices)]
        assert new.time_s == old.time_s
        assert new.steps_per_s == pytest.approx(sum(rates.values()))
        assert new.per_device_steps == pytest.approx({n: rates[n] * old.time_s for n in new.devices})


def test_every_configuration_makes_each_multi_device_training_a_set(recorded) -> None:
    _, runs, _ = measurement_bound.inputs_from_round(recorded, TOTAL_STEPS, 1, "every configuration")
    trained = {frozenset(c["devices"]): c["runs"][1] for c in recorded["configurations"] if len(c["devices"]) > 1}
    assert {frozenset(r.devices) for r in runs} == set(trained) and len(runs) == 11
    for run in runs:
        training = trained[frozenset(run.devices)]
        assert run.time_s == training["time_s"]
        assert run.steps_per_s == pytest.approx(sum(training["steady_steps_per_s"].values()))
        assert run.power_w * run.time_s == pytest.approx(sum(training["energy_per_device_j"].values()))


def test_the_planner_s_warnings_are_quiet_only_while_it_runs(cases) -> None:
    import logging

    assert logging.getLogger("hetcluster.planner").level == logging.NOTSET   # as before main() ran

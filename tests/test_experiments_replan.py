"""experiments/replan.py: today's planner re-scored on a recorded ground truth, and its ablations.

Uses a recording kept as test data (the five-device run: profile + 31 configurations each trained
twice), so the re-planning path is checked on what a real run left, not on a hand-made dict.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from recorded_truths import RESULTS, copy_recordings

from experiments import recordings, replan

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
RECORDING = RESULTS / "full-x4-r2-5dev" / "raw" / "small_cnn.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDING.read_text())


def _predicted(evaluation: dict) -> dict[frozenset, float]:
    return {frozenset(c["devices"]): c["predicted"]["time_s"] for c in evaluation["configurations"]}


def test_without_sets_keeps_solo_predictions_and_changes_the_multi_device_ones(recorded) -> None:
    """Without sets a configuration trains at its members' solo rates' sum; with them and the solo
    windows as read (no revision), the same prediction exactly where the fitted R(S) is capped at
    that sum (here 9 of the 26, all without the server: the regression puts them at or above it),
    and a different one wherever the sets found contention."""
    from hetcluster.planner import FittedModels, plan
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    as_read = replan.replan(recorded, 2000, without="rate-revision")
    without = replan.replan(recorded, 2000, without="sets")
    before, after = _predicted(as_read), _predicted(without)
    solo = [k for k in before if len(k) == 1]
    multi = [k for k in before if len(k) > 1]
    assert len(solo) == 5 and len(multi) == 26
    assert all(after[k] == pytest.approx(before[k], rel=1e-12) for k in solo)   # no set enters a solo window
    inputs = to_planner_inputs(Profile.from_dict(recorded["profile"]), 2000)
    table = plan(*inputs, "edp", (), models=FittedModels.fit(*inputs, revise_rates=False)).table
    at_solo_sum = {frozenset(row["devices"]): row["steps_per_s"] >= row["demand_steps_per_s"] * (1 - 1e-12)
                   for row in table.to_dict("records")}
    moved = {k for k in multi if after[k] != pytest.approx(before[k], rel=1e-6)}
    assert moved == {k for k in multi if not at_solo_sum[k]}
    assert len(moved) > len(multi) / 2
    assert [c["measured"] for c in without["configurations"]] == [c["measured"] for c in as_read["configurations"]]


def test_the_sets_revise_the_solo_predictions_of_the_devices_they_measured(recorded) -> None:
    """With the revision (the default) a device's solo prediction moves where the sets measured
    it, and the ablation --without-rate-revision gives the solo windows' predictions back."""
    revised, as_read = (
        _predicted(replan.replan(recorded, 2000)),
        _predicted(replan.replan(recorded, 2000, without="rate-revision")),
    )
    measured_in_sets = {
        n for r in recorded["profile"]["runs"] if len(r["devices"]) > 1 for n in r.get("per_device_steps", {})
    }
    solo = [k for k in revised if len(k) == 1]
    assert measured_in_sets and {next(iter(k)) for k in solo} >= measured_in_sets
    assert any(revised[k] != pytest.approx(as_read[k], rel=1e-3) for k in solo)


def test_a_device_no_set_measured_keeps_its_solo_prediction(recorded) -> None:
    """The recording with its one two-device set only (server + jetson-xavier): the three boards
    no set measured keep their windows' solo predictions under the revision."""
    import copy

    trimmed = copy.deepcopy(recorded)
    trimmed["profile"]["runs"] = [r for r in trimmed["profile"]["runs"] if len(r["devices"]) < 3]
    assert [r["devices"] for r in trimmed["profile"]["runs"] if len(r["devices"]) > 1] == [["server", "jetson-xavier"]]
    revised = _predicted(replan.replan(trimmed, 2000))
    as_read = _predicted(replan.replan(trimmed, 2000, without="rate-revision"))
    unmeasured = [frozenset({name}) for name in ("jetson-nano", "phone", "rpi4")]
    assert all(revised[k] == pytest.approx(as_read[k], rel=1e-12) for k in unmeasured)


def test_repeated_truth_is_scored_for_separation(recorded) -> None:
    objectives = replan.replan(recorded, 2000)["objectives"]
    assert {name: score["separated"] for name, score in objectives.items()} == \
        {"time": True, "power": True, "energy": True, "edp": True}


def test_all_repeated_rescores_only_repeated_truths_in_one_table(tmp_path, caplog) -> None:
    copy_recordings(
        tmp_path / "root", (("full-x4-r2-5dev", "small_cnn"), ("full", "small_cnn"))
    )  # twice-, once-trained
    found = recordings.load(tmp_path / "root")
    assert [r.label for r in found] == ["full/small_cnn", "full-x4-r2-5dev/small_cnn"]   # by folder name
    frames = replan.rescore_repeated(found, tmp_path / "out")
    assert set(frames["choices"]["model"]) == {"full-x4-r2-5dev/small_cnn"}   # the once-trained truth is left out
    summary = frames["summary"].set_index("scope")
    assert summary.loc["all", "cases"] == 4 and summary.loc["all", "separated_cases"] == 4
    assert summary.loc["all", "exact"] == pytest.approx(1.0)
    assert "unseen" not in summary.index   # no recording marked unseen: no such scope
    assert (tmp_path / "out" / "summary.csv").exists() and (tmp_path / "out" / "accuracy.png").exists()
    assert (
        (tmp_path / "out" / "summary.md").read_text().splitlines()[2].startswith("| **all** | **4** | **4 (100 %)** |")
    )

    once, repeated = found
    marked = [dataclasses.replace(repeated, unseen=True), once]
    with caplog.at_level("INFO", logger="replan"):
        summary = replan.rescore_repeated(marked, tmp_path / "out")["summary"].set_index("scope")
    assert "recordings new none, gone none; 0 earlier choices changed" in caplog.text   # against the first table
    assert summary.loc["unseen", "cases"] == 4 and summary.loc["unseen", "exact"] == pytest.approx(1.0)

    with pytest.raises(SystemExit, match="marked unseen that the headline cannot score: full/small_cnn"):
        replan.rescore_repeated([repeated, dataclasses.replace(once, unseen=True)], tmp_path / "out")
    left_out = [dataclasses.replace(repeated, left_out="other work beside its pre-training"), once]
    with pytest.raises(SystemExit, match="no counted repeated-truth recording"):
        replan.rescore_repeated(left_out, tmp_path / "out")


def test_changed_choices_names_the_moved_cases_and_the_recordings_new_or_gone() -> None:
    def choices(rows):
        return pd.DataFrame(rows, columns=["model", "objective", "chosen", "exact", "regret"])

    before = choices([("a/m", "time", "x+y", True, 0.0), ("a/m", "edp", "x", False, 0.1),
                      ("b/m", "time", "y", True, 0.0), ("c/m", "time", "x", True, 0.0)])
    after = choices([("a/m", "time", "x+y", True, 0.0), ("a/m", "edp", "x+y", True, 0.0),
                     ("b/m", "time", "y", False, 0.2),   # same choice, but no longer exact: counts as moved
                     ("d/m", "time", "y", True, 0.0)])
    moved, added, removed = replan.changed_choices(before, after)
    assert added == ["d/m"] and removed == ["c/m"]
    assert moved[["model", "objective"]].values.tolist() == [["a/m", "edp"], ["b/m", "time"]]
    assert moved.set_index("objective").loc["edp", ["chosen_before", "chosen_after"]].tolist() == ["x", "x+y"]
    moved, added, removed = replan.changed_choices(after, after)
    assert moved.empty and added == removed == []


def test_the_table_is_replaced_between_its_markers_only() -> None:
    start, end = replan.TABLE_MARKERS
    readme = f"# title\n- item:\n\n  {start}\n  | old |\n  {end}\n\n  after\n"
    assert replan.with_table(readme, "| a |\n|---|\n| 1 |\n") == (
        f"# title\n- item:\n\n  {start}\n  | a |\n  |---|\n  | 1 |\n  {end}\n\n  after\n")
    assert replan.with_table(f"{start}\n{end}\n", "| a |\n") == f"{start}\n| a |\n{end}\n"   # first line
    with pytest.raises(SystemExit, match="markers once each"):
        replan.with_table("# no markers\n", "| a |\n")
    with pytest.raises(SystemExit, match="markers once each"):
        replan.with_table(f"{end}\n{start}\n", "| a |\n")


def test_the_readme_and_the_experiments_page_show_the_committed_headline() -> None:
    """replan.py --all-repeated writes summary.md and the pages' tables from summary.csv: a results
    commit that skipped either step fails here."""
    from experiments import accuracy

    out = EXPERIMENTS / "results" / "choice_accuracy" / "replanned-repeated"
    summary = pd.read_csv(out / "summary.csv")
    assert (out / "summary.md").read_text() == accuracy.markdown_table(summary)
    tables = replan.headline_tables(summary)
    readme = tables[EXPERIMENTS.parent / "README.md"]
    assert (
        readme.splitlines()[0]
        == "| scope | cases | exact | exact where the truth separates its best | against one round |"
    )
    assert readme.splitlines()[-1].startswith("| reference paper |  | 76.67 % |")
    assert tables[EXPERIMENTS.parent / "docs" / "experiments.md"] == (out / "summary.md").read_text()
    for page, table in tables.items():
        assert replan.with_table(page.read_text(), table) == page.read_text(), page


def test_as_lanes_keeps_the_fleets_set_and_adds_runs_only_within_the_budget() -> None:
    """The lane protocol's replay of a sequential recording: with no budget, each device's first
    solo window and the fleet's set alone; with the whole job as budget, the fastest device's two
    windows pooled as recorded, and further sets in the protocol's order while a choice is a
    near-tie."""
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    def rechecked(recording: recordings.Recording) -> bool:   # recorded with the fastest's second window
        return any(len(d.get("solo_rates_steps_per_s", [])) > 1 and d.get("solo_window_ends_s")
                   for d in recording.evaluation["profile"]["devices"])

    recording = next(r for r in recordings.load(recordings.DATASET) if r.scored and rechecked(r))
    profile = Profile.from_dict(recording.evaluation["profile"])
    devices, runs, job = to_planner_inputs(profile, recording.total_steps)
    [twice] = [d for d in profile.devices if len(d.solo_rates_steps_per_s) > 1]
    fastest = twice.name
    fleet = frozenset(d.name for d in devices)
    objectives = list(recording.evaluation["objectives"])

    lean, lean_runs = replan.as_lanes(profile, devices, runs, job, objectives, budget_share=0.0)
    assert [frozenset(r.devices) for r in lean_runs] == [fleet]
    rate = {d.name: d.steps_per_s for d in lean}
    assert rate[fastest] == pytest.approx(twice.solo_rates_steps_per_s[0] * twice.memory_slowdown)
    assert all(rate[d.name] == d.steps_per_s for d in devices if d.name != fastest)

    full, full_runs = replan.as_lanes(profile, devices, runs, job, objectives, budget_share=1.0)
    assert {d.name: d.steps_per_s for d in full} == {d.name: d.steps_per_s for d in devices}
    assert frozenset(full_runs[0].devices) == fleet and len(full_runs) <= len(runs)
    assert all(r in runs for r in full_runs)


def test_as_lanes_budgets_from_its_own_steps_and_seconds(monkeypatch) -> None:
    """The replay's budget is the product's: the planner is asked about the lanes' own steps and
    seconds so far (within the step budget), not the sequential recording's."""
    import hetcluster.planner
    from hetcluster.profiling.pretrain import budget_steps
    from hetcluster.profiling.profile import Profile, to_planner_inputs

    recording = next(r for r in recordings.load(recordings.DATASET)
                     if r.scored and r.evaluation["profile"]["pretrain_steps"] > r.total_steps / 3)
    profile = Profile.from_dict(recording.evaluation["profile"])
    devices, runs, job = to_planner_inputs(profile, recording.total_steps)
    asked = []
    real_plan = hetcluster.planner.plan

    def recording_plan(devices, runs, job, *args, **kwargs):
        asked.append(job)
        return real_plan(devices, runs, job, *args, **kwargs)

    monkeypatch.setattr(hetcluster.planner, "plan", recording_plan)
    replan.as_lanes(profile, devices, runs, job, list(recording.evaluation["objectives"]), budget_share=1 / 3)
    assert asked, "the replay asked the planner nothing"
    assert all(0 < j.pretrain_steps <= budget_steps(job.total_steps, 1 / 3) for j in asked)
    assert all(0 < j.pretrain_time_s < profile.pretrain_time_s for j in asked)

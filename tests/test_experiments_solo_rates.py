"""experiments/investigations/solo_rates.py on recorded truths: one whose evaluation kept each run's
steady rates and pooled the fastest device's two solo windows, and one from before either."""

from __future__ import annotations

import pytest
from recorded_truths import RESULTS

from experiments.investigations import solo_rates


def test_a_recording_with_steady_rates_and_two_windows_is_read_as_measured():
    [recording] = solo_rates.repeated_recordings([RESULTS / "full-x2-r2-vgg16-sxn"])
    report = solo_rates.report(recording)
    [server] = [line for line in report["lines"] if line.strip().startswith("server ")]
    # both windows and the pooled figure; the trainings' own steady rates (no estimate mark)
    assert "1.32 / 1.63 (pooled 1.46)" in server and "trained 1.82, 1.83" in server and "~" not in server
    # the pooled 1.46 read 20 % under the trainings' mean of 1.83
    assert report["fastest_error"] == pytest.approx(1.46 / 1.825 - 1, abs=0.01)
    assert len(report["ratio_errors"]) == 2


def test_an_older_recording_estimates_the_steady_rate_from_the_measured_start_up():
    [recording] = solo_rates.repeated_recordings([RESULTS / "full-x2-r2-densenet121-str"])
    report = solo_rates.report(recording)
    [server] = [line for line in report["lines"] if line.strip().startswith("server ")]
    assert "trained ~" in server and "(pooled" not in server
    # 160 steps in 71.6 s less the 13.1 s start-up: ~2.73 steps/s against the window's 4.10
    assert report["fastest_error"] == pytest.approx(0.50, abs=0.03)


def test_the_fastest_devices_best_partner_is_scored_on_the_whole_job():
    [recording] = solo_rates.repeated_recordings([RESULTS / "full-x2-r2-vgg16-sxn"])
    partner, trained, predicted = solo_rates.report(recording)["best_pair"]
    # server+jetson-xavier trained 4.2 % faster than the server alone (mean whole-job times of the
    # two rounds); the planner predicts a gain too, from the plan, not the truth
    assert partner == "jetson-xavier"
    assert trained == pytest.approx(-0.0423, abs=0.001)
    assert -0.09 < predicted < -0.03 and predicted != pytest.approx(trained, abs=0.005)


def test_every_partner_of_the_fastest_is_scored_and_the_best_is_one_of_them():
    """The best partner is picked by the trainings it is scored against; every partner's error is
    kept beside it so the summary can tell that selection from a bias of the planner."""
    [recording] = solo_rates.repeated_recordings([RESULTS / "full-x2-r2-vgg16-sxn"])
    report = solo_rates.report(recording)
    gains = report["pair_gains"]
    assert report["fastest_class"] == "server"
    assert sorted(g[0] for g in gains) == ["jetson-nano", "jetson-xavier"]
    assert report["best_pair"] in gains and report["best_pair"][1] == min(g[1] for g in gains)
    line = solo_rates._gain_errors("the server fastest", [report])
    assert "of 2 above 0" in line and "the best partner" in line and "the others" in line
    assert solo_rates._gain_errors("a board fastest", []) is None


def test_a_long_window_with_its_completions_is_also_read_over_its_first_steps(tmp_path, capsys):
    """The paired comparison: the same solo run over its first SHORT_WINDOW_STEPS steps (what a
    short window would have read) and over its whole window, each against the trainings."""
    import json
    import shutil

    folder = tmp_path / "full-x2-r2-vgg16-sxn"
    shutil.copytree(RESULTS / "full-x2-r2-vgg16-sxn", folder)
    raw = folder / "raw" / "vgg16.json"
    data = json.loads(raw.read_text())
    # jetson-nano (trained 0.40 and 0.41 steps/s): five steps at 0.3 steps/s, then seven at 0.5
    ends = [10 / 3 * k for k in range(1, 6)] + [50 / 3 + 2.0 * k for k in range(1, 8)]
    [nano] = [d for d in data["profile"]["devices"] if d["name"] == "jetson-nano"]
    nano["solo_window_ends_s"] = [ends]
    raw.write_text(json.dumps(data))

    [recording] = solo_rates.repeated_recordings([folder])
    report = solo_rates.report(recording)
    trained = solo_rates.statistics.fmean(
        solo_rates.steady_rate(r, "jetson-nano", 0, 0.0)[0]
        for c in data["configurations"] if c["devices"] == ["jetson-nano"] for r in c["runs"])
    [(first, whole)] = report["paired"]
    assert first == pytest.approx(0.3 / trained - 1, abs=1e-6)
    assert whole == pytest.approx(12 / ends[-1] / trained - 1, abs=1e-6) and first < whole
    [line] = [line for line in report["lines"] if line.strip().startswith("jetson-nano ")]
    assert "its first 5 steps" in line and "(12 steps)" in line
    assert solo_rates.main(["--from", str(folder)]) == 0
    assert "the first 5 steps read a median" in capsys.readouterr().out
    # windows of 8 steps or fewer, and recordings without completions, are not paired
    nano["solo_window_ends_s"] = [ends[:8]]
    raw.write_text(json.dumps(data))
    assert solo_rates.report(*solo_rates.repeated_recordings([folder]))["paired"] == []


def test_each_member_of_a_calibration_set_is_read_against_the_same_configurations_trainings():
    """A member's rate in a set (its steps there over the set's window) against its steady rate in
    the trainings of that configuration; a member some training did not record is left out."""
    run = {"devices": ["phone", "rpi4"], "time_s": 2.0, "per_device_steps": {"phone": 18.0, "rpi4": 6.0}}
    pair = [{"steady_steps_per_s": {"phone": 9.0, "rpi4": 3.0}}, {"steady_steps_per_s": {"phone": 11.0}}]
    trainings = {frozenset(["phone", "rpi4"]): pair}
    [(steps, error)] = solo_rates._set_members(run, trainings)
    assert steps == 18.0 and error == pytest.approx(9.0 / 10.0 - 1)
    pair[1]["steady_steps_per_s"]["rpi4"] = 2.0
    members = dict(solo_rates._set_members(run, trainings))
    assert members[6.0] == pytest.approx(3.0 / 2.5 - 1) and len(members) == 2
    # a lone device is no set, and one training is no mean of the trainings
    assert solo_rates._set_members({**run, "devices": ["phone"]}, {frozenset(["phone"]): pair}) == []
    assert solo_rates._set_members(run, {frozenset(["phone", "rpi4"]): pair[:1]}) == []


def test_the_summary_reads_the_set_members_of_a_recorded_truth(capsys):
    [recording] = solo_rates.repeated_recordings([RESULTS / "full-x2-r2-smallcnn-xrr"])
    members = solo_rates.report(recording)["set_members"]
    # three sets: jetson-xavier+rpi4-1+rpi4-2, jetson-xavier+rpi4-1, rpi4-1+rpi4-2; seven members
    assert len(members) == 7 and all(steps > 0 for steps, _ in members)
    assert solo_rates.main(["--from", str(RESULTS / "full-x2-r2-smallcnn-xrr")]) == 0
    assert "calibration sets' members with <= 8 steps in the set, over" in capsys.readouterr().out

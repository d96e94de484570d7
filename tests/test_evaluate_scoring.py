"""Scoring the planner against measured configurations: best, exact, regret, MAPE."""

import pytest

from hetcluster.evaluation.scoring import ConfigurationResult, mape, score_objective
from hetcluster.training.report import JobMetrics


def _metrics(time_s, power_w, pre_t=10.0, pre_e=100.0):
    energy = pre_e + power_w * (time_s - pre_t)
    return JobMetrics(time_s, power_w, energy, energy * time_s)


RESULTS = [
    ConfigurationResult(("a",), predicted=_metrics(100.0, 10.0), measured=_metrics(110.0, 10.0)),
    ConfigurationResult(("b",), predicted=_metrics(60.0, 50.0), measured=_metrics(60.0, 40.0)),
    ConfigurationResult(("a", "b"), predicted=_metrics(50.0, 60.0), measured=_metrics(70.0, 55.0)),
    ConfigurationResult(("c",), predicted=_metrics(30.0, 5.0), measured=None, error="launch failed"),
]


def test_exact_choice_has_zero_regret():
    score = score_objective(RESULTS, "time", ("b",))
    assert score["best"] == ["b"] and score["exact"] is True and score["regret"] == 0.0


def test_wrong_choice_regret_is_relative_to_the_measured_best():
    score = score_objective(RESULTS, "time", ("b", "a"))  # order does not matter
    assert score["exact"] is False and score["regret"] == pytest.approx((70.0 - 60.0) / 60.0)
    power = score_objective(RESULTS, "power", ("a", "b"))
    assert power["best"] == ["a"] and power["regret"] == pytest.approx((55.0 - 10.0) / 10.0)


def test_unmeasured_choice_has_no_verdict():
    score = score_objective(RESULTS, "energy", ("c",))
    assert score["exact"] is None and score["regret"] is None and score["best"] is not None


def test_the_best_among_the_plans_near_ties_is_recorded_beside_exact():
    wrong = score_objective(RESULTS, "time", ("a", "b"), near_ties=[("a",), ("b",)])   # best b: a near-tie
    assert wrong["exact"] is False and wrong["best_among_near_ties"] is True
    assert wrong["near_ties"] == [["a"], ["b"]]
    assert score_objective(RESULTS, "time", ("a", "b"), near_ties=[("a",)])["best_among_near_ties"] is False
    assert score_objective(RESULTS, "time", ("b",), near_ties=[])["best_among_near_ties"] is True      # exact
    assert score_objective(RESULTS, "time", ("c",), near_ties=[])["best_among_near_ties"] is None      # unmeasured
    assert "near_ties" not in score_objective(RESULTS, "time", ("b",))


def test_mape_over_measured_configurations_only():
    errors = mape(RESULTS)
    expected_time = (10 / 110 + 0 + 20 / 70) / 3
    assert errors["time_s"] == pytest.approx(expected_time)
    assert errors["power_w"] == pytest.approx((0 + 10 / 40 + 5 / 55) / 3)
    phase = mape(RESULTS, pretrain_time_s=10.0, pretrain_energy_j=100.0)
    assert phase["time_s"] == pytest.approx((10 / 100 + 0 + 20 / 60) / 3)  # pre-training taken out of both


def _repeated(devices, *run_times_s, power_w=10.0, pre_t=10.0, pre_e=100.0):
    """A configuration trained once per run time (a run's energy = power × its time)."""
    from hetcluster.evaluation.harness import merge_repeats

    pretrain = {"time_s": pre_t, "energy_j": pre_e}
    runs = [ConfigurationResult(devices, predicted=_metrics(50.0, power_w), measured=_metrics(pre_t + t, power_w),
                                details={"run": {"time_s": t, "energy_j": power_w * t}}) for t in run_times_s]
    return merge_repeats(runs, pretrain)


def test_repeated_configuration_is_measured_by_its_mean_run_and_keeps_every_run():
    merged = _repeated(("a",), 40.0, 60.0, power_w=10.0)
    assert merged.measured.time_s == pytest.approx(10.0 + 50.0)
    assert merged.measured.energy_j == pytest.approx(100.0 + 10.0 * 50.0)
    assert [m.time_s for m in merged.repeats] == pytest.approx([50.0, 70.0])
    assert [r["time_s"] for r in merged.details["runs"]] == [40.0, 60.0]
    assert merged.to_dict()["repeats"][1]["time_s"] == pytest.approx(70.0)


def test_a_failed_repeat_keeps_its_error_beside_the_runs_that_worked():
    from hetcluster.evaluation.harness import merge_repeats

    ok = _repeated(("a",), 40.0)
    failed = ConfigurationResult(("a",), predicted=ok.predicted, measured=None, error="launch failed")
    merged = merge_repeats([ok, failed], {"time_s": 10.0, "energy_j": 100.0})
    assert merged.measured.time_s == pytest.approx(50.0) and merged.error == "launch failed"
    both_failed = merge_repeats([failed, failed], {"time_s": 10.0, "energy_j": 100.0})
    assert both_failed.measured is None and both_failed.repeats == []


def test_within_noise_when_the_runs_of_chosen_and_best_overlap():
    results = [_repeated(("a",), 40.0, 50.0), _repeated(("b",), 44.0, 56.0), _repeated(("c",), 60.0, 62.0)]
    best = score_objective(results, "time", ("a",))
    assert best["exact"] is True and best["within_noise"] is True
    overlapping = score_objective(results, "time", ("b",))  # mean 50 vs 45, but 44 < 50
    assert overlapping["exact"] is False and overlapping["within_noise"] is True
    apart = score_objective(results, "time", ("c",))          # 60 > 50: every run slower than every run of a
    assert apart["exact"] is False and apart["within_noise"] is False


def test_within_noise_needs_repeats_of_both():
    assert "within_noise" not in score_objective(RESULTS, "time", ("a", "b"))


def test_truth_separated_when_every_run_of_the_best_beats_every_run_of_the_rest():
    overlapping = [_repeated(("a",), 40.0, 50.0), _repeated(("b",), 44.0, 56.0), _repeated(("c",), 60.0, 62.0)]
    assert score_objective(overlapping, "time", ("a",))["separated"] is False   # b's 44 s beats a's 50 s
    apart = [_repeated(("a",), 40.0, 43.0, power_w=5.0), _repeated(("b",), 44.0, 56.0), _repeated(("c",), 60.0, 62.0)]
    assert score_objective(apart, "time", ("b",))["separated"] is True         # a: 43 s < b's 44 s; exact or not
    assert score_objective(apart, "power", ("a",))["separated"] is True        # 5 W against 10 W
    assert score_objective(overlapping, "power", ("a",))["separated"] is False  # 10 W each: a tie
    tied = [_repeated(("a",), 40.0, 44.0), _repeated(("b",), 44.0, 56.0)]
    assert score_objective(tied, "time", ("a",))["separated"] is False         # equal runs do not separate
    assert "separated" not in score_objective(RESULTS, "time", ("b",))          # trained once


def test_rounds_name_their_own_best_and_the_choice_is_scored_against_each():
    # round 1: a 40 s, b 44 s → a; round 2: a 50 s, b 46 s → b
    results = [_repeated(("a",), 40.0, 50.0), _repeated(("b",), 44.0, 46.0), _repeated(("c",), 60.0, 62.0)]
    score = score_objective(results, "time", ("a",))
    assert score["rounds_agree"] is False and score["exact_per_round"] == pytest.approx(0.5)
    assert score_objective(results, "time", ("c",))["exact_per_round"] == 0.0
    steady = [_repeated(("a",), 40.0, 41.0), _repeated(("b",), 44.0, 46.0)]
    agreed = score_objective(steady, "time", ("a",))
    assert agreed["rounds_agree"] is True and agreed["exact_per_round"] == 1.0
    once = score_objective(RESULTS, "time", ("b",))                            # trained once: no rounds
    assert "rounds_agree" not in once and "exact_per_round" not in once

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


def test_mape_over_measured_configurations_only():
    errors = mape(RESULTS)
    expected_time = (10 / 110 + 0 + 20 / 70) / 3
    assert errors["time_s"] == pytest.approx(expected_time)
    assert errors["power_w"] == pytest.approx((0 + 10 / 40 + 5 / 55) / 3)
    phase = mape(RESULTS, pretrain_time_s=10.0, pretrain_energy_j=100.0)
    assert phase["time_s"] == pytest.approx((10 / 100 + 0 + 20 / 60) / 3)  # pre-training taken out of both

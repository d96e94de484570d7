"""Re-planning in the middle of a job (planner/replan.py), on data alone: when a switch pays for
itself, when it does not, a configuration with no worker left, and the job's constraints."""

from __future__ import annotations

import math

import pytest

from hetcluster.planner import DeviceMeasurement, Exclude, Require, RunMeasurement
from hetcluster.planner.replan import JobProgress, SwitchCost, replan

A = DeviceMeasurement("a", steps_per_s=5.0, busy_power_w=6.0, idle_power_w=2.0, startup_s=2.0, first_step_s=1.0)
B = DeviceMeasurement("b", steps_per_s=4.0, busy_power_w=5.0, idle_power_w=2.0, startup_s=2.0, first_step_s=1.0)
C = DeviceMeasurement("c", steps_per_s=20.0, busy_power_w=40.0, idle_power_w=10.0, startup_s=1.0, first_step_s=0.5)
RUNS = (RunMeasurement(("a", "b"), steps=90, time_s=10.0, steps_per_s=9.0, power_w=11.0,
                       per_device_steps={"a": 50.0, "b": 40.0}),)
COST = SwitchCost(drain_s=1.0, stop_s=1.0, launch_s={"a": 20.0, "b": 20.0, "c": 6.0}, default_launch_s=20.0)


def _progress(remaining: int, total: int = 2000) -> JobProgress:
    return JobProgress(total_steps=total, steps_done=total - remaining, elapsed_s=100.0, energy_j=500.0)


def test_a_fast_device_that_joins_early_is_switched_to_and_the_line_says_why():
    decision = replan((A, C), (), _progress(1500), ("a",), "time", cost=COST)
    assert decision.switch and decision.chosen in (("c",), ("a", "c"))
    assert decision.saving > decision.switch_cost > 0
    # the cost of the candidate: drain, stop, its slowest member's relaunch and its warm-up
    assert decision.switch_cost == pytest.approx(1.0 + 1.0 + decision.candidate.launch_s + decision.candidate.startup_s,
                                                 rel=0.05)
    line = decision.line()
    assert "saves" in line and "switching costs" in line and "switching from a" in line
    assert decision.to_dict()["switch"] is True


def test_late_in_the_job_the_saving_is_below_the_cost_and_the_job_stays():
    decision = replan((A, C), (), _progress(30), ("a",), "time", cost=COST)
    assert not decision.switch and decision.chosen == ("a",)
    assert 0 < decision.saving < decision.switch_cost
    line = decision.line()
    assert "would save" in line and "switching would cost" in line and line.endswith("staying on a")


@pytest.mark.parametrize("objective", ["time", "energy", "edp", "power"])
def test_a_switch_is_taken_exactly_when_its_saving_exceeds_its_cost(objective):
    for remaining in (20, 100, 300, 1000, 1900):
        decision = replan((A, B, C), RUNS, _progress(remaining), ("a", "b"), objective, cost=COST)
        if decision.candidate is not None and math.isfinite(decision.saving):
            assert decision.switch == (decision.saving > decision.switch_cost), (objective, remaining)


def test_with_no_worker_left_the_job_switches_to_the_best_of_the_rest():
    decision = replan((B, C), (), _progress(800), (), "energy", cost=COST)
    assert decision.current is None and decision.switch
    assert decision.chosen and set(decision.chosen) <= {"b", "c"}
    assert "nothing trains now" in decision.line()


def test_old_minus_the_lost_device_being_all_there_is_keeps_training_without_a_switch():
    decision = replan((A,), (), _progress(800), ("a", "b"), "time", cost=COST)   # b left; a alone remains
    assert not decision.switch and decision.chosen == ("a",) and decision.candidate is None
    assert "staying on a" in decision.line()


def test_constraints_hold_and_a_required_device_that_left_is_no_longer_required():
    decision = replan((A, B, C), RUNS, _progress(1500), ("a", "b"), "time", (Exclude(("c",)), Require(("gone",))),
                      cost=COST)
    assert "c" not in decision.chosen
    decision = replan((A, C), (), _progress(1500), ("a",), "time", (Require(("a",)),), cost=COST)
    assert "a" in decision.chosen

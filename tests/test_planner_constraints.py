"""Constraints as boolean masks, and infeasible requests that say what failed and what it costs."""

import pytest

from hetcluster.errors import InfeasibleError, PlanningError
from hetcluster.planner import (
    Deadline,
    DeviceMeasurement,
    Exclude,
    JobSpec,
    MaxEnergy,
    MaxPower,
    Require,
    choose,
    estimate,
    plan,
)

A = DeviceMeasurement("A", 10.0, 100.0, 50.0)
B = DeviceMeasurement("B", 5.0, 20.0, 10.0)
C = DeviceMeasurement("C", 2.0, 10.0, 4.0, memory_fits=False)
FLEET = (A, B, C)
JOB = JobSpec(total_steps=1000)


@pytest.fixture(scope="module")
def table():
    return estimate(FLEET, [], JOB)


def test_memory_fit_is_always_applied(table):
    plan_ = choose(table, "power")            # C is cheapest but does not fit
    assert plan_.chosen == ("B",)
    assert not plan_.table.loc[plan_.table["devices"].map(lambda d: "C" in d), "feasible"].any()


def test_deadline_and_power_cap(table):
    assert choose(table, "energy", [Deadline(70.0)]).chosen == ("A", "B")       # T = 66.7 s
    assert choose(table, "time", [MaxPower(110.0)]).chosen == ("A",)            # AB needs 120 W
    assert choose(table, "time", [MaxEnergy(5000.0)]).chosen == ("B",)


def test_require_and_exclude(table):
    assert choose(table, "energy", [Require(("A",))]).chosen == ("A", "B")
    assert choose(table, "time", [Exclude(("A",))]).chosen == ("B",)
    assert choose(table, "time", [Require("B"), Exclude("A")]).chosen == ("B",)


def test_infeasible_names_the_constraint_and_the_nearest_cost(table):
    with pytest.raises(InfeasibleError) as caught:
        choose(table, "energy", [Deadline(10.0)])
    message = str(caught.value)
    assert "deadline 10 s (--deadline)" in message
    assert "A+B" in message and "66.67 s" in message   # the fastest feasible one, what it costs
    assert "To fix: relax or drop --deadline" in message


def test_infeasible_combination_reports_the_least_violating(table):
    with pytest.raises(InfeasibleError) as caught:
        choose(table, "time", [Deadline(60.0), MaxPower(15.0)])
    message = str(caught.value)
    assert "least-violating" in message
    assert "power cap" in message or "deadline" in message


def test_unknown_device_in_require_is_a_clear_error(table):
    with pytest.raises(PlanningError, match="Unknown device"):
        choose(table, "time", [Require(("Z",))])


def test_bad_limit_is_a_clear_error():
    with pytest.raises(PlanningError, match="--deadline"):
        Deadline(-1.0)


def test_class_mode_require_and_exclude_pick_the_named_devices():
    fleet = [DeviceMeasurement(f"n{i}", 2.0, 7.0, 2.0, class_key="nano") for i in range(4)]
    fleet.append(DeviceMeasurement("srv", 20.0, 200.0, 60.0))
    chosen = plan(fleet, [], JOB, "energy", [Require(("n3",)), Exclude(("n0",))], mode="classes", search=True)
    assert "n3" in chosen.chosen and "n0" not in chosen.chosen
    exact = plan(fleet, [], JOB, "energy", [Require(("n3",)), Exclude(("n0",))], mode="devices")
    assert exact.chosen_row["energy_j"] == pytest.approx(chosen.chosen_row["energy_j"])


def test_excluded_devices_still_idle_when_idle_power_counts():
    fleet = [DeviceMeasurement(f"n{i}", 2.0, 7.0, 2.0, class_key="nano") for i in range(3)]
    fleet.append(DeviceMeasurement("srv", 20.0, 200.0, 60.0))
    job = JobSpec(total_steps=1000, idle_power_counts=True)
    exact = plan(fleet, [], job, "energy", [Exclude(("srv",))], mode="devices")
    grouped = plan(fleet, [], job, "energy", [Exclude(("srv",))], mode="classes")
    assert grouped.chosen_row["power_w"] == pytest.approx(exact.chosen_row["power_w"])
    assert grouped.chosen_row["energy_j"] == pytest.approx(exact.chosen_row["energy_j"])


def test_nothing_fits_in_memory_says_so():
    fleet = [
        DeviceMeasurement("x", 1.0, 5.0, 1.0, memory_fits=False),
        DeviceMeasurement("y", 2.0, 5.0, 1.0, memory_fits=False),
    ]
    with pytest.raises(InfeasibleError, match="memory fit"):
        choose(estimate(fleet, [], JOB), "time")

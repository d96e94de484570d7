"""Enumeration counts and objective choice on cases computed by hand."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from hetcluster.errors import PlanningError
from hetcluster.planner import (
    DeviceMeasurement,
    FittedModels,
    JobSpec,
    PowerModel,
    RunMeasurement,
    ThroughputModel,
    choose,
    class_configurations,
    enumerate_configurations,
    estimate,
    get_objective,
    pareto_front,
)
from hetcluster.planner.configurations import names_for_masks
from hetcluster.planner.throughput import Contention

# Three devices, no multi-device runs → no contention: R = Σ r_i, P = Σ busy.
A = DeviceMeasurement("A", 10.0, 100.0, 50.0)
B = DeviceMeasurement("B", 5.0, 20.0, 10.0)
C = DeviceMeasurement("C", 2.0, 10.0, 4.0)
FLEET = (A, B, C)
# by hand, N = 1000 steps:
#   A    R=10 T=100    P=100 E=10000  EDP=1.0e6
#   B    R=5  T=200    P=20  E=4000   EDP=8.0e5
#   C    R=2  T=500    P=10  E=5000   EDP=2.5e6
#   AB   R=15 T=66.67  P=120 E=8000   EDP=5.33e5
#   AC   R=12 T=83.33  P=110 E=9166.7 EDP=7.64e5
#   BC   R=7  T=142.86 P=30  E=4285.7 EDP=6.12e5
#   ABC  R=17 T=58.82  P=130 E=7647.1 EDP=4.50e5


@pytest.mark.parametrize("n", [1, 2, 5, 10, 16])
def test_enumeration_count(n):
    masks = enumerate_configurations(n)
    assert masks.size == 2 ** n - 1
    assert masks.min() == 1 and masks.max() == 2 ** n - 1
    assert np.unique(masks).size == masks.size


def test_class_configuration_count_and_bounds():
    counts = [3, 0, 2, 1]
    vectors = class_configurations(counts)
    assert len(vectors) == 4 * 1 * 3 * 2 - 1
    assert np.unique(vectors, axis=0).shape[0] == len(vectors)
    assert (vectors >= 0).all() and (vectors <= np.array(counts)).all()
    assert not (vectors.sum(axis=1) == 0).any()


def test_names_for_masks_matches_bits():
    names = tuple(f"d{i}" for i in range(23))
    masks = np.array([1, 2 ** 22, 2 ** 22 + 2 ** 10 + 5])
    out = names_for_masks(masks, names)
    assert out[0] == ("d0",)
    assert out[1] == ("d22",)
    assert out[2] == ("d0", "d2", "d10", "d22")


def test_device_set_column_reads_as_tuples_but_holds_masks():
    import pandas as pd

    from hetcluster.planner.configurations import DeviceSetArray

    names = ("a", "b", "c")
    column = DeviceSetArray(np.array([1, 6, 7]), names)
    frame = pd.DataFrame({"devices": column, "x": [3.0, 1.0, 2.0]})
    assert frame["devices"].iloc[1] == ("b", "c")
    assert list(frame["devices"]) == [("a",), ("b", "c"), ("a", "b", "c")]
    assert (frame["devices"] == ("b", "c")).tolist() == [False, True, False]
    assert (frame["devices"] == ("c", "b")).tolist() == [False, False, False]  # tuple order, as tuples
    assert (frame["devices"] == ("z",)).tolist() == [False, False, False]
    ordered = frame.sort_values("x").reset_index(drop=True)
    assert ordered["devices"].tolist() == [("b", "c"), ("a", "b", "c"), ("a",)]
    assert ordered["devices"].array.masks.tolist() == [6, 7, 1]
    assert frame["devices"].map("+".join).tolist() == ["a", "b+c", "a+b+c"]
    assert frame["devices"].map(len).tolist() == [1, 2, 3]
    assert frame["devices"].to_numpy(dtype=object)[2] == ("a", "b", "c")
    both = pd.concat([frame.head(1), frame.tail(1)])
    assert both["devices"].tolist() == [("a",), ("a", "b", "c")]
    assert frame.to_dict("records")[1]["devices"] == ("b", "c")


@pytest.mark.parametrize(
    "objective, expected",
    [("time", ("A", "B", "C")), ("power", ("C",)), ("energy", ("B",)), ("edp", ("A", "B", "C"))],
)
def test_hand_computed_choice(objective, expected):
    plan = choose(estimate(FLEET, [], JobSpec(total_steps=1000)), objective)
    assert plan.chosen == expected
    assert plan.table["chosen"].iloc[0] and plan.table["chosen"].sum() == 1


def test_hand_computed_values():
    table = estimate(FLEET, [], JobSpec(total_steps=1000))
    row = table[table["devices"] == ("A", "B")].iloc[0]
    assert row["steps_per_s"] == pytest.approx(15.0)
    assert row["time_s"] == pytest.approx(1000 / 15)
    assert row["power_w"] == pytest.approx(120.0)
    assert row["energy_j"] == pytest.approx(8000.0)
    assert row["edp_js"] == pytest.approx(8000.0 * 1000 / 15)


def test_idle_power_counts_changes_the_energy_choice():
    # idle devices burn power: A 100+10+4=114 W → 11400 J; B 20+50+4=74 W → 14800 J;
    # ABC 130 W → 7647 J (best); power: C alone 10+50+10 = 70 W (best).
    job = JobSpec(total_steps=1000, idle_power_counts=True)
    table = estimate(FLEET, [], job)
    assert choose(table, "energy").chosen == ("A", "B", "C")
    plan = choose(table, "power")
    assert plan.chosen == ("C",)
    assert plan.chosen_row["power_w"] == pytest.approx(70.0)


def test_pretraining_counts_toward_the_job():
    job = JobSpec(total_steps=1000, pretrain_steps=100, pretrain_time_s=20.0, pretrain_energy_j=500.0)
    row = estimate(FLEET, [], job).iloc[0]  # A alone
    assert row["time_s"] == pytest.approx(20.0 + 900 / 10)
    assert row["energy_j"] == pytest.approx(500.0 + 100.0 * 900 / 10)


def test_memory_slowdown_enters_the_time():
    slow = DeviceMeasurement("A", 10.0, 100.0, 50.0, memory_slowdown=1.25)
    row = estimate((slow,), [], JobSpec(total_steps=1000)).iloc[0]
    assert row["time_s"] == pytest.approx(125.0)


def test_every_member_runs_under_its_own_memory_plan():
    # each worker trains under its own device's plan (memory.fit.training_memory): A's 10 steps/s
    # beside C's 2 steps/s under C's ×1.5 plan → AC: R = 10 + 2/1.5, not both divided by 1.5
    tight = DeviceMeasurement("C", 2.0, 10.0, 4.0, memory_slowdown=1.5)
    table = estimate((A, B, tight), [], JobSpec(total_steps=1000)).set_index("devices")
    assert table.loc[[("A",)], "steps_per_s"].iloc[0] == pytest.approx(10.0)
    assert table.loc[[("C",)], "steps_per_s"].iloc[0] == pytest.approx(2.0 / 1.5)
    assert table.loc[[("A", "B")], "steps_per_s"].iloc[0] == pytest.approx(15.0)
    assert table.loc[[("A", "C")], "steps_per_s"].iloc[0] == pytest.approx(10.0 + 2.0 / 1.5)
    assert table.loc[[("A", "B", "C")], "steps_per_s"].iloc[0] == pytest.approx(15.0 + 2.0 / 1.5)


@pytest.mark.parametrize("family", ["queue", "waterfill"])
def test_under_contention_each_member_is_divided_by_its_own_plans_slowdown(family):
    # ABC with C's plan (×1.4) and B's (×1.2) is the plain fleet with B's rate divided by 1.2 and
    # C's by 1.4 in every configuration (A untouched)
    planned = (A, DeviceMeasurement("B", 5.0, 20.0, 10.0, memory_slowdown=1.2),
               DeviceMeasurement("C", 2.0, 10.0, 4.0, memory_slowdown=1.4))
    contention = Contention(family, 1.0 / 14.0)  # binds the plain rates (15.6), not the planned ones
    masks = np.array([7, 3, 5, 1])
    steps, _ = ThroughputModel(devices=planned, contention=contention).predict(masks)
    divided = tuple(DeviceMeasurement(d.name, d.steps_per_s / s, d.busy_power_w, d.idle_power_w)
                    for d, s in zip(FLEET, (1.0, 1.2, 1.4)))
    expected, _ = ThroughputModel(devices=divided, contention=contention).predict(masks)
    np.testing.assert_allclose(steps, expected, rtol=1e-9)


def test_waterfill_contention_by_hand():
    # capacity 12 steps/s shared max-min: AB → x_A = 7, x_B = 5 (θ = 7); A is busy 70 % of the time:
    # P = 50 + 50·0.7 + 20 = 105 W.
    throughput = ThroughputModel(devices=FLEET, contention=Contention("waterfill", 1.0 / 12.0))
    models = FittedModels(throughput, PowerModel(), JobSpec(total_steps=1200))
    table = estimate(FLEET, [], models.job, models=models)
    row = table[table["devices"] == ("A", "B")].iloc[0]
    assert row["steps_per_s"] == pytest.approx(12.0)
    assert row["power_w"] == pytest.approx(105.0)
    solo = table[table["devices"] == ("A",)].iloc[0]
    assert solo["steps_per_s"] == pytest.approx(10.0)


def test_power_fit_leaves_out_a_set_where_no_member_trained_steadily():
    """Such a set's power is the mean over the whole run (set-up, the engine's joins), not training
    power; the sets that recorded who trained steadily calibrate γ. Without any per-device record
    (a trace that has none) every set is used."""
    throughput = ThroughputModel(devices=FLEET)   # no contention: u = 1, P(S) = Σ busy
    steady = [RunMeasurement(("A", "B"), 30, 2.0, 15.0, 120.0, per_device_steps={"A": 20, "B": 10}),
              RunMeasurement(("B", "C"), 14, 2.0, 7.0, 30.0, per_device_steps={"B": 10, "C": 4})]
    unsteady = RunMeasurement(("A", "B", "C"), 17, 1.0, 17.0, 65.0)   # half of Σ busy = 130 W
    assert PowerModel.fit(throughput, steady + [unsteady]).multi_factor == pytest.approx(1.0)
    legacy = [dataclasses.replace(r, per_device_steps={}) for r in steady + [unsteady]]
    assert PowerModel.fit(throughput, legacy).multi_factor < 0.9


def test_queue_contention_by_hand():
    # two identical workers r = 1, s = 0.5: w² + 0.5w − 0.25 = 0 → w = 0.309, R = 2/(1 + w) = 1.528
    twins = (DeviceMeasurement("x", 1.0, 2.0, 1.0), DeviceMeasurement("y", 1.0, 2.0, 1.0))
    model = ThroughputModel(devices=twins, contention=Contention("queue", 0.5))
    steps, _ = model.predict(np.array([1, 2, 3]))
    w = (-0.5 + np.sqrt(1.25)) / 2
    assert steps[0] == pytest.approx(1.0) and steps[1] == pytest.approx(1.0)
    assert steps[2] == pytest.approx(2 / (1 + w), rel=1e-9)


def test_fast_workers_lose_more_under_contention():
    from hetcluster.planner.throughput import utilisation

    fleet = (DeviceMeasurement("fast", 10.0, 1, 1), DeviceMeasurement("slow", 1.0, 1, 1))
    for family, capacity in (("queue", 15.0), ("waterfill", 10.8)):
        model = ThroughputModel(devices=fleet, contention=Contention(family, 1 / capacity))
        steps, _ = model.predict(np.array([1, 2, 3]))
        assert steps[0] == pytest.approx(10.0) and steps[1] == pytest.approx(1.0)
        assert steps[0] < steps[2] <= capacity + 1e-9     # more than the fast one alone, within capacity
        u_fast, u_slow = utilisation(np.array([[1.0, 1.0]]), np.array([10.0, 1.0]), model.contention)[0]
        assert u_fast < u_slow <= 1.0


def test_pareto_front_by_hand():
    table = estimate(FLEET, [], JobSpec(total_steps=1000))
    front = table.loc[pareto_front(table), "devices"].tolist()
    # (T, E): ABC (58.8, 7647) AB (66.7, 8000)✗ BC (142.9, 4286) B (200, 4000) → front ABC, BC, B
    assert sorted(front) == sorted([("A", "B", "C"), ("B", "C"), ("B",)])


def test_unknown_objective_is_a_clear_error():
    with pytest.raises(PlanningError, match="use one of"):
        get_objective("speed")


def test_importing_the_planner_loads_no_grpc_tensorflow_or_sklearn():
    code = (
        "import sys, hetcluster.planner; "
        "bad = [m for m in ('grpc', 'tensorflow', 'sklearn') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_runs_naming_excluded_or_failed_devices_are_dropped_not_fatal(caplog):
    runs = [
        RunMeasurement(("A", "gone"), 100, 10.0, 12.0, 130.0),   # a device that failed in pre-training
        RunMeasurement(("A", "B"), 100, 10.0, 0.0, 120.0),       # a run that applied no step
    ]
    with caplog.at_level("WARNING"):
        table = estimate(FLEET, runs, JobSpec(total_steps=1000))
    assert len(table) == 7
    assert "ignoring run A+gone" in caplog.text and "ignoring run A+B" in caplog.text


def test_device_measurement_errors_are_clear():
    with pytest.raises(PlanningError, match="steps_per_s of device 'A'"):
        estimate((DeviceMeasurement("A", 0.0, 1.0, 1.0),), [], JobSpec(total_steps=10))
    with pytest.raises(PlanningError, match="Duplicate device names"):
        estimate((A, A), [], JobSpec(total_steps=10))

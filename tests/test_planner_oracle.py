"""Class aggregation and the count-vector search against brute force over every device subset.

Random seeded fleets with identical-device classes (SkyPilot's test_optimizer_random_dag idea):
the best objective value and the chosen counts per class must match exhaustive enumeration.
"""

from collections import Counter

import numpy as np
import pytest

from hetcluster.errors import InfeasibleError
from hetcluster.planner import (
    Deadline,
    DeviceMeasurement,
    FittedModels,
    JobSpec,
    MaxPower,
    RunMeasurement,
    plan,
)


def random_fleet(seed: int):
    rng = np.random.default_rng(seed)
    n_classes = int(rng.integers(2, 5))
    devices = []
    for c in range(n_classes):
        rate = float(rng.uniform(0.5, 20.0))
        idle = float(rng.uniform(1.0, 30.0))
        busy = idle + float(rng.uniform(1.0, 60.0))
        for j in range(int(rng.integers(1, 5))):
            devices.append(DeviceMeasurement(f"c{c}-{j}", rate, busy, idle, class_key=f"c{c}"))
    devices = devices[:12]
    names = [d.name for d in devices]
    # one contended multi-device run so the queue model has a non-zero service time
    chosen = tuple(rng.choice(names, size=min(len(names), 4), replace=False))
    demand = sum(d.steps_per_s for d in devices if d.name in chosen)
    runs = (RunMeasurement(chosen, 200, 10.0, demand * float(rng.uniform(0.5, 0.95)), 50.0),)
    job = JobSpec(total_steps=5000, pretrain_steps=200, pretrain_time_s=30.0,
                  idle_power_counts=bool(rng.integers(0, 2)), pretrain_energy_j=900.0)
    return devices, runs, job


def class_counts(plan_result) -> Counter:
    return Counter(name.split("-")[0] for name in plan_result.chosen)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("objective", ["time", "power", "energy", "edp"])
def test_classes_and_search_match_brute_force(seed, objective):
    devices, runs, job = random_fleet(seed)
    models = FittedModels.fit(devices, runs, job)
    exact = plan(devices, runs, job, objective, mode="devices", models=models)
    grouped = plan(devices, runs, job, objective, mode="classes", models=models)
    searched = plan(devices, runs, job, objective, mode="classes", models=models, search=True)
    best = exact.table[exact.objective.column].iloc[0]
    for other in (grouped, searched):
        assert other.table[other.objective.column].iloc[0] == pytest.approx(best, rel=1e-6)
        assert class_counts(other) == class_counts(exact)


@pytest.mark.parametrize("seed", range(4))
def test_classes_match_brute_force_when_some_classes_train_under_memory_plans(seed):
    from dataclasses import replace

    devices, runs, job = random_fleet(200 + seed)
    slowdowns = {"c0": 1.3, "c1": 1.1}  # every configuration with a c0 device runs at 1/1.3
    devices = [replace(d, memory_slowdown=slowdowns.get(d.class_key, 1.0)) for d in devices]
    models = FittedModels.fit(devices, runs, job)
    for objective in ("time", "edp"):
        exact = plan(devices, runs, job, objective, mode="devices", models=models)
        grouped = plan(devices, runs, job, objective, mode="classes", models=models)
        assert grouped.table[grouped.objective.column].iloc[0] == pytest.approx(
            exact.table[exact.objective.column].iloc[0], rel=1e-6
        )
        assert class_counts(grouped) == class_counts(exact)


@pytest.mark.parametrize("seed", range(6))
def test_constrained_search_matches_brute_force(seed):
    devices, runs, job = random_fleet(100 + seed)
    models = FittedModels.fit(devices, runs, job)
    free = plan(devices, runs, job, "time", mode="devices", models=models)
    # a deadline and power cap that bind: a middle row's values
    middle = free.table.iloc[len(free.table) // 2]
    constraints = (Deadline(float(middle["time_s"]) * 1.5), MaxPower(float(middle["power_w"]) * 1.2))
    try:
        exact = plan(devices, runs, job, "edp", constraints, mode="devices", models=models)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            plan(devices, runs, job, "edp", constraints, mode="classes", models=models, search=True)
        return
    searched = plan(devices, runs, job, "edp", constraints, mode="classes", models=models, search=True)
    assert searched.table["edp_js"].iloc[0] == pytest.approx(exact.table["edp_js"].iloc[0], rel=1e-6)
    assert class_counts(searched) == class_counts(exact)


def test_search_on_distinct_devices_is_near_brute_force():
    """Every device its own class (0/1 count vectors): the pattern search is a heuristic there;
    it must find the exact optimum almost always and never be more than 1 % off."""
    from hetcluster.planner import RunMeasurement as Run

    gaps = []
    for seed in range(8):
        rng = np.random.default_rng(1000 + seed)
        devices = [DeviceMeasurement(f"d{i}", float(rng.uniform(0.5, 20)), float(rng.uniform(5, 150)),
                                     float(rng.uniform(1, 5))) for i in range(10)]
        names = [d.name for d in devices]
        demand = lambda sub: sum(d.steps_per_s for d in devices if d.name in sub)  # noqa: E731
        runs = [Run(tuple(names), 100, 1.0, demand(names) * 0.6, 500.0),
                Run(tuple(names[:5]), 100, 1.0, demand(names[:5]) * 0.85, 200.0),
                Run(tuple(names[3:9]), 100, 1.0, demand(names[3:9]) * 0.8, 200.0)]
        job = JobSpec(total_steps=5000, idle_power_counts=bool(seed % 2))
        models = FittedModels.fit(devices, runs, job)
        for objective in ("time", "energy", "edp"):
            exact = plan(devices, runs, job, objective, mode="devices", models=models)
            searched = plan(devices, runs, job, objective, mode="classes", models=models, search=True)
            column = exact.objective.column
            gaps.append(searched.table[column].iloc[0] / exact.table[column].iloc[0] - 1.0)
    gaps = np.array(gaps)
    assert gaps.min() >= -1e-9          # never better than exhaustive: same model, same table
    assert gaps.max() < 0.01
    assert np.mean(gaps <= 1e-9) >= 0.9


def test_large_fleets_switch_to_classes_and_search():
    rng = np.random.default_rng(7)
    devices = []
    for k in range(12):
        rate, idle = float(rng.uniform(0.5, 20)), float(rng.uniform(1, 30))
        devices += [DeviceMeasurement(f"k{k}-{j}", rate, idle + float(rng.uniform(5, 60)), idle, class_key=f"k{k}")
                    for j in range(84 if k < 11 else 76)]
    assert len(devices) == 1000
    names = [d.name for d in devices]
    runs = (RunMeasurement(tuple(names[::7]), 100, 1.0, 0.5 * sum(d.steps_per_s for d in devices[::7]), 900.0),)
    job = JobSpec(total_steps=100_000)
    result = plan(devices, runs, job, "edp")
    assert result.table.attrs["mode"] == "classes" and result.table.attrs.get("search") == "pattern"
    assert result.table.attrs["configurations_total"] > 10 ** 20
    row = result.chosen_row
    assert (
        len(row["devices"]) == row["n_workers"]
        and sum(int(c.split("×")[1]) for c in row["classes"]) == row["n_workers"]
    )
    # small enough to list: 3 classes of 10 → every count vector
    small = [d for k in ("k0", "k1", "k2") for d in [x for x in devices if x.class_key == k][:8]]
    listed = plan(small, (), job, "time", mode="auto")   # 24 devices > 20: classes, all listed
    assert listed.table.attrs["mode"] == "classes" and "search" not in listed.table.attrs
    assert len(listed.table) == 9 ** 3 - 1


def test_auto_groups_a_small_fleet_whose_devices_share_a_class_and_lists_each_composition_once():
    devices, runs, job = random_fleet(3)
    models = FittedModels.fit(devices, runs, job)
    counts = Counter(d.class_key for d in devices)
    assert max(counts.values()) > 1 and len(devices) <= 20
    auto = plan(devices, runs, job, "edp", models=models)
    exact = plan(devices, runs, job, "edp", mode="devices", models=models)
    assert auto.table.attrs["mode"] == "classes"
    assert len(auto.table) == np.prod([c + 1 for c in counts.values()]) - 1 < len(exact.table)
    assert auto.table["edp_js"].iloc[0] == pytest.approx(exact.table["edp_js"].iloc[0], rel=1e-6)
    # devices of no shared class are listed one by one, as before
    lone = [DeviceMeasurement(d.name, d.steps_per_s, d.busy_power_w, d.idle_power_w) for d in devices]
    assert plan(lone, runs, job, "edp", models=FittedModels.fit(lone, runs, job)).table.attrs["mode"] == "devices"

"""planner/solo_rates.py: a device's solo rate revised by what the calibration sets measured of it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetcluster.planner import DeviceMeasurement, FittedModels, JobSpec, ThroughputModel
from hetcluster.planner.inputs import RunMeasurement
from hetcluster.planner.solo_rates import SOLO_FLOOR, revise_solo_rates


def device(name: str, rate: float, power_w: float = 10.0, **extra) -> DeviceMeasurement:
    return DeviceMeasurement(name, rate, power_w, power_w / 2, **extra)


def run(rates: dict[str, float], time_s: float = 10.0) -> RunMeasurement:
    """A set whose members trained at these rates over time_s."""
    total = sum(rates.values())
    return RunMeasurement(tuple(rates), round(total * time_s), time_s, total, 10.0 * len(rates),
                          per_device_steps={n: r * time_s for n, r in rates.items()})


def rates_of(devices) -> dict[str, float]:
    return {d.name: d.steps_per_s for d in devices}


def test_a_window_that_read_a_device_slow_is_pulled_toward_the_sets_by_hand_computed_weights():
    """No contention (the sets ran at the members' rates, or above): every elasticity is 1, and
    δ_b = (Σ e/σ_set²) / (n/σ_set² + 1/σ_solo²) with σ_set the RMS of all members' residuals."""
    devices = (device("a", 10.0), device("b", 4.0), device("c", 3.0))
    runs = [run({"a": 10.0, "b": 5.0, "c": 3.0}), run({"b": 5.0, "c": 3.0})]
    throughput = ThroughputModel.fit(devices, runs)
    assert throughput.service_s == 0.0
    revised = rates_of(revise_solo_rates(devices, runs, throughput))
    e = math.log(5.0 / 4.0)
    sigma_set2 = 2 * e * e / 5            # five member observations, two of them b's
    delta = (2 * e / sigma_set2) / (2 / sigma_set2 + 1 / SOLO_FLOOR ** 2)
    assert revised["b"] == pytest.approx(4.0 * math.exp(delta), rel=1e-9)
    assert 4.0 < revised["b"] < 5.0
    assert revised["a"] == 10.0 and revised["c"] == 3.0


def test_a_wide_solo_window_moves_further_than_a_tight_one():
    runs = [run({"a": 10.0, "b": 5.0}), run({"b": 5.0, "c": 3.0})]
    moved = []
    for std in (0.0, 2.0):   # σ_solo 5 % (the floor) or 50 %
        devices = (device("a", 10.0), device("b", 4.0, steps_per_s_std=std), device("c", 3.0))
        moved.append(rates_of(revise_solo_rates(devices, runs, ThroughputModel.fit(devices, runs)))["b"])
    assert 4.0 < moved[0] < moved[1] < 5.0


def test_a_device_the_shared_resource_holds_back_keeps_its_window():
    """Water-filling caps the server at θ in the set: its measured rate there says nothing of its
    own (elasticity 0), while the uncapped board's does."""
    devices = (device("server", 20.0), device("board", 2.0))
    runs = [run({"server": 10.0, "board": 2.4})]
    throughput = ThroughputModel.fit(devices, runs, variant=("waterfill", False))
    assert throughput.contention.family == "waterfill" and throughput.service_s > 0
    revised = rates_of(revise_solo_rates(devices, runs, throughput))
    assert revised["server"] == 20.0
    assert revised["board"] > 2.0


def test_nothing_moves_without_sets_or_for_a_device_no_set_measured():
    devices = (device("a", 10.0), device("b", 4.0), device("c", 3.0))
    assert revise_solo_rates(devices, [], ThroughputModel.fit(devices, [])) == devices
    runs = [run({"a": 11.0, "b": 5.0})]
    revised = rates_of(revise_solo_rates(devices, runs, ThroughputModel.fit(devices, runs)))
    assert revised["c"] == 3.0 and revised["b"] > 4.0


def test_a_class_of_identical_devices_takes_one_factor():
    """Over 20 devices the fit runs on classes: a class is revised as one unit, every member alike."""
    devices = tuple(device(f"nano-{i}", 2.0, class_key="nano") for i in range(12)) + \
        tuple(device(f"pi-{i}", 1.0, class_key="pi") for i in range(10))
    runs = [run({"nano-0": 2.5, "pi-0": 1.0}), run({"nano-3": 2.5, "nano-4": 2.5, "pi-1": 1.0})]
    revised = rates_of(revise_solo_rates(devices, runs, ThroughputModel.fit(devices, runs)))
    nanos = {revised[f"nano-{i}"] for i in range(12)}
    assert len(nanos) == 1 and 2.0 < nanos.pop() < 2.5
    assert {revised[f"pi-{i}"] for i in range(10)} == {1.0}


def test_the_estimator_revises_by_default_and_can_keep_the_windows():
    devices = (device("a", 10.0), device("b", 4.0), device("c", 3.0))
    runs = [run({"a": 10.0, "b": 5.0, "c": 3.0}), run({"b": 5.0, "c": 3.0})]
    job = JobSpec(total_steps=1000)
    revised = FittedModels.fit(devices, runs, job).throughput.measured_units().rate_steps_per_s
    as_read = FittedModels.fit(devices, runs, job, revise_rates=False).throughput.measured_units().rate_steps_per_s
    assert np.array_equal(as_read, [10.0, 4.0, 3.0])
    assert revised[1] > 4.0 and revised[0] == 10.0

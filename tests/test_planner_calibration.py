"""Calibration on a recorded-format trace improves the throughput prediction of unseen sets.

tests/data/planner/synthetic_contention_trace.csv is SYNTHETIC (see make_synthetic_trace.py beside
it: a capacity shared max-min fairly that shrinks per extra worker, 2 % noise) — a stand-in until
real traces recorded on the emulated cluster are added in the same format. The planner sees only
what pre-training would measure (every device alone plus a few multi-device sets) and is scored
on all the other configurations of the trace.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from hetcluster.errors import ProfileError
from hetcluster.planner import FittedModels, JobSpec, ThroughputModel, choose, estimate, load_trace, write_trace
from hetcluster.planner.calibration import ResidualRegression, RunData, predict_runs, residual_features
from hetcluster.planner.configurations import membership
from hetcluster.profiling.profile import Profile, to_planner_inputs

TRACE = Path(__file__).parent / "data" / "planner" / "synthetic_contention_trace.csv"
RESNET50_SXR = Path(__file__).parent / "data" / "choice_accuracy" / "full-x2-r2-resnet50-sxr" / "raw" / "resnet50.json"


def split(devices, runs):
    names = [d.name for d in sorted(devices, key=lambda d: -d.steps_per_s)]
    calibration = {
        tuple(sorted(names)),                 # all devices
        tuple(sorted(names[:2])),             # the two fastest
        tuple(sorted(names[1:])),             # all but the fastest
        tuple(sorted(names[:3])),             # the fastest half
    }
    seen = [r for r in runs if len(r.devices) == 1 or tuple(sorted(r.devices)) in calibration]
    unseen = [r for r in runs if len(r.devices) > 1 and tuple(sorted(r.devices)) not in calibration]
    return seen, unseen


def rms_log_error(model: ThroughputModel, devices, runs) -> float:
    index = {d.name: i for i, d in enumerate(devices)}
    masks = np.array([sum(1 << index[n] for n in r.devices) for r in runs])
    predicted, _ = model.predict(masks)
    measured = np.array([r.steps_per_s for r in runs])
    return float(np.sqrt(np.mean(np.log(predicted / measured) ** 2)))


def test_load_trace_reads_devices_and_runs():
    devices, runs = load_trace(TRACE)
    assert [d.name for d in devices] == ["server", "xavier", "tx2", "nano", "rpi4", "phone"]
    assert len(runs) == 63
    assert devices[0].idle_power_w == 65.0
    full = [r for r in runs if len(r.devices) == 6][0]
    assert sum(full.per_device_steps.values()) == pytest.approx(full.steps, abs=3)


def test_calibration_beats_the_uncalibrated_sum_on_unseen_configurations():
    devices, runs = load_trace(TRACE)
    seen, unseen = split(devices, runs)
    uncalibrated = ThroughputModel.fit(devices, [])          # R = Σ r_i
    calibrated = ThroughputModel.fit(devices, seen)
    err_raw = rms_log_error(uncalibrated, devices, unseen)
    err_cal = rms_log_error(calibrated, devices, unseen)
    assert err_cal < 0.5 * err_raw, (err_cal, err_raw)
    assert err_cal < 0.08
    assert calibrated.contention.family == "waterfill"       # the per-device slowdowns say so


def test_residual_regression_keeps_error_low_and_uncertainty_is_honest():
    devices, runs = load_trace(TRACE)
    seen, unseen = split(devices, runs)
    with_regression = ThroughputModel.fit(devices, seen, use_regression=True)
    assert with_regression.regression is not None
    assert rms_log_error(with_regression, devices, unseen) < 0.1
    # the reported relative std of multi-device predictions is of the size of the real error
    auto = ThroughputModel.fit(devices, seen)
    err = rms_log_error(auto, devices, unseen)
    assert 0.2 * err <= auto.model_std <= 5 * err + 0.02


def test_a_device_alone_carries_the_models_error_beside_its_windows_spread():
    devices, runs = load_trace(TRACE)
    seen, _ = split(devices, runs)
    model = ThroughputModel.fit(devices, seen)
    steps, std = model.predict(1 << np.arange(len(devices)))
    window = np.array([d.steps_per_s_std / d.steps_per_s for d in devices])
    assert std / steps == pytest.approx(np.sqrt(window ** 2 + model.model_std ** 2), rel=1e-9)
    assert np.all(std / steps >= model.model_std)


def test_no_configuration_is_predicted_faster_than_its_members_solo_rates_together():
    """The residual regression, fitted on four sets, would put some of the other 53 configurations
    up to 1.4 % above Σ r_i; no worker trains faster beside others than alone."""
    devices, runs = load_trace(TRACE)
    seen, _ = split(devices, runs)
    model = ThroughputModel.fit(devices, seen, use_regression=True)
    masks = np.arange(1, 2 ** len(devices))
    weights = membership(masks, len(devices))
    predicted, _ = model.predict(masks)
    solo_sums = weights @ np.array([d.steps_per_s for d in devices])
    assert np.all(predicted <= solo_sums * (1 + 1e-12))
    assert np.any(predicted < 0.9 * solo_sums)  # and the contention is still there
    # the factor it returns (the start-up lag, power and uncertainty scale by it) is the capped one
    units = model.units(classes=False)
    steps, _, queue, factor = model.predict_weights(weights, units)
    assert steps == pytest.approx(queue.steps_per_s * factor, rel=1e-12)
    assert np.any(factor < np.exp(model.regression.predict(residual_features(weights, units))))


def test_leave_one_out_scores_the_regression_as_it_will_predict_capped_at_the_solo_sum():
    """The regression's leave-one-out error decides whether it is used: it must score the capped
    predictions the planner would make, not the raw extrapolation."""
    devices, runs = load_trace(TRACE)
    seen, _ = split(devices, runs)
    model = ThroughputModel.fit(devices, seen)
    units = model.measured_units()
    data = RunData.of(units, [r for r in seen if len(r.devices) > 1])
    lifting = ResidualRegression(pipeline=None, coef=np.array([5.0, 5.0, 5.0]))  # e^(5·features): far above any sum
    assert predict_runs(data, units, model.contention, lifting) == pytest.approx(data.weights @ units.rate_steps_per_s)
    assert np.any(
        predict_runs(data, units, model.contention) < 0.9 * data.weights @ units.rate_steps_per_s
    )  # not trivially the sum


def test_the_regression_needs_three_sets_that_measured_every_member():
    """The unseen resnet50 run on server + jetson-xavier + rpi4: the step cap ended two of its three
    sets before the boards trained steadily (their per-device rates hold one member), and a
    regression fitted on them extrapolated past the rpi4's solo rate. It is not even tried there;
    with every member's rate recorded in each set it is."""
    recording = json.loads(RESNET50_SXR.read_text())
    devices, runs, _ = to_planner_inputs(Profile.from_dict(recording["profile"]), 280)
    assert sum(r.every_member_steady for r in runs if len(r.devices) > 1) == 1
    model = ThroughputModel.fit(devices, runs)
    assert model.regression is None and "regression" not in model.loo_errors
    rates = {d.name: d.steps_per_s for d in devices}
    complete = [
        dataclasses.replace(r, per_device_steps={n: max(1, round(rates[n] * r.time_s * 0.9)) for n in r.devices})
        for r in runs
    ]
    assert "regression" in ThroughputModel.fit(devices, complete).loo_errors


def test_calibrated_plan_picks_the_measured_best_more_often_than_uncalibrated():
    devices, runs = load_trace(TRACE)
    seen, _ = split(devices, runs)
    truth = {tuple(sorted(r.devices)): r for r in runs}
    job = JobSpec(total_steps=4000)

    def measured(objective, names):
        r = truth[tuple(sorted(names))]
        t = job.total_steps / r.steps_per_s
        return {"time": t, "power": r.power_w, "energy": r.power_w * t, "edp": r.power_w * t * t}[objective]

    def regret(table, objective):
        best = min(measured(objective, k) for k in truth)
        return measured(objective, choose(table, objective).chosen) / best - 1.0

    calibrated = estimate(devices, seen, job)
    naive = estimate(devices, [], job, models=FittedModels.fit(devices, [], job))
    for objective in ("time", "edp"):
        assert regret(calibrated, objective) <= regret(naive, objective)
    assert regret(calibrated, "edp") < 0.05


def test_trace_round_trip(tmp_path):
    devices, runs = load_trace(TRACE)
    out = tmp_path / "copy.csv"
    write_trace(out, devices, runs)
    devices2, runs2 = load_trace(out)
    assert devices2 == devices
    assert [r.devices for r in runs2] == [r.devices for r in runs]


def test_trace_missing_column_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("devices,steps\nserver,10\n")
    with pytest.raises(ProfileError, match="lacks columns"):
        load_trace(bad)


def test_memory_plan_slowdown_does_not_bias_the_contention_fit():
    """Pre-training runs without memory plans: the fit must use the measured solo rates, and the
    plan's slowdown only enter the predictions."""
    from dataclasses import replace

    devices, runs = load_trace(TRACE)
    seen, _ = split(devices, runs)
    plain = ThroughputModel.fit(devices, seen)
    slowed_devices = [replace(d, memory_slowdown=2.0) if d.name == "server" else d for d in devices]
    slowed = ThroughputModel.fit(slowed_devices, seen)
    assert slowed.contention == plain.contention
    server_alone, _ = slowed.predict(np.array([1]))
    assert server_alone[0] == pytest.approx(devices[0].steps_per_s / 2.0)

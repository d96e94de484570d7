"""Start-up in the time and energy estimate: each worker's steady line starts late, no run ends
before every member's first step is back, and the start-up draws its own measured power
(hand-computed cases); and how pre-training measures all three."""

import numpy as np
import pytest

from hetcluster.agent.client import mean_power_between
from hetcluster.planner import DeviceMeasurement, JobSpec, choose, estimate
from hetcluster.power.base import PowerSample
from hetcluster.profiling.pretrain import _startup, _startup_power_w
from hetcluster.profiling.profile import DeviceProfile, Profile, to_planner_inputs
from hetcluster.training.spec import RunResult

# no multi-device runs → no contention: x_i = r_i
FAST = DeviceMeasurement("fast", 10.0, 100.0, 50.0, startup_s=1.0, first_step_s=1.1)
SLOW = DeviceMeasurement("slow", 1.0, 10.0, 5.0, startup_s=29.0, first_step_s=30.0)
JOB = JobSpec(total_steps=120, pretrain_steps=20, pretrain_time_s=50.0, pretrain_energy_j=1000.0)


def _row(table, devices):
    return table.loc[table["devices"].map(lambda d: tuple(d) == devices)].iloc[0]


def test_time_is_the_lagged_fluid_end_or_the_slowest_first_step():
    table = estimate((FAST, SLOW), [], JOB)
    # fast alone: (100 + 10·1)/10 = 11 s after pre-training
    assert _row(table, ("fast",))["time_s"] == pytest.approx(50.0 + 11.0)
    # slow alone: (100 + 1·29)/1 = 129 s
    assert _row(table, ("slow",))["time_s"] == pytest.approx(50.0 + 129.0)
    # together the fluid end is (100 + 10 + 29)/11 = 12.6 s, but the slow board's first step
    # comes back at 30 s: the run cannot end before it
    both = _row(table, ("fast", "slow"))
    assert both["time_s"] == pytest.approx(50.0 + 30.0)
    # energy: both busy (110 W) until the fluid end at 139/11 s; then the fast device waits idle
    # (its 50 W dynamic power stops) while the slow one finishes its first step
    fluid_end_s = 139.0 / 11.0
    run_j = 110.0 * 30.0 - 50.0 * (30.0 - fluid_end_s)
    assert both["energy_j"] == pytest.approx(1000.0 + run_j)
    assert both["power_w"] == pytest.approx(run_j / 30.0)  # the run's mean, as a meter reads it
    # so for time the fast device alone wins, though the pair sums more throughput
    assert choose(table, "time").chosen == ("fast",)
    assert both["steps_per_s"] > _row(table, ("fast",))["steps_per_s"]


def test_start_up_is_priced_at_its_measured_power():
    # the same devices, their start-ups measured at 70 W (fast: below its 100 W training power)
    # and 9 W (slow); times do not change
    fast, slow = (
        DeviceMeasurement(
            d.name,
            d.steps_per_s,
            d.busy_power_w,
            d.idle_power_w,
            startup_s=d.startup_s,
            first_step_s=d.first_step_s,
            startup_power_w=q,
        )
        for d, q in ((FAST, 70.0), (SLOW, 9.0))
    )
    plain, priced = estimate((FAST, SLOW), [], JOB), estimate((fast, slow), [], JOB)
    assert np.allclose(priced["time_s"], plain["time_s"])
    # fast alone: 11 s, of which its 1 s start-up at 70 W instead of 100 W
    assert _row(priced, ("fast",))["energy_j"] == pytest.approx(1000.0 + 100.0 * 11.0 - 30.0 * 1.0)
    assert _row(priced, ("slow",))["energy_j"] == pytest.approx(1000.0 + 10.0 * 129.0 - 1.0 * 29.0)
    # together: the tail as before, less each member's start-up gap
    fluid_end_s = 139.0 / 11.0
    run_j = 110.0 * 30.0 - 50.0 * (30.0 - fluid_end_s) - 30.0 * 1.0 - 1.0 * 29.0
    both = _row(priced, ("fast", "slow"))
    assert both["energy_j"] == pytest.approx(1000.0 + run_j)
    assert both["power_w"] == pytest.approx(run_j / 30.0)
    # and a start-up measured above training power (a board whose set-up saturates it) costs more
    hot = DeviceMeasurement("fast", 10.0, 100.0, 50.0, startup_s=1.0, first_step_s=1.1, startup_power_w=120.0)
    assert _row(estimate((hot,), [], JOB), ("fast",))["energy_j"] == pytest.approx(1000.0 + 1100.0 + 20.0)


def test_start_up_power_under_contention_replaces_the_members_power_in_the_set():
    # a measured set run makes the pair contend (u < 1, γ fitted): the gap is P_i(S) − Q_i per
    # member, so pricing every start-up at exactly P_i(S) must change nothing
    from hetcluster.planner import RunMeasurement
    from hetcluster.planner.estimate import FittedModels, weights_of

    a = DeviceMeasurement("a", 10.0, 100.0, 50.0, startup_s=2.0, first_step_s=2.5)
    b = DeviceMeasurement("b", 6.0, 40.0, 10.0, startup_s=3.0, first_step_s=3.5)
    runs = [RunMeasurement(("a", "b"), steps=100, time_s=10.0, steps_per_s=10.0, power_w=120.0,
                           per_device_steps={"a": 62, "b": 38})]
    models = FittedModels.fit((a, b), runs, JOB)
    units = models.throughput.units(classes=False)
    weights = weights_of(units, np.array([3]))
    dyn = units.busy_power_w - units.idle_power_w
    _, _, q, factor = models.throughput.predict_weights(weights, units, dyn)
    in_set_w = models.power.members_weighted(weights, units, q.weighted_util, factor, np.ones(2))
    power_w, _ = models.power.predict(weights, units, q.weighted_util, factor, False)
    assert in_set_w == pytest.approx(power_w)  # Σ P_i(S) is the configuration's power
    # each member's own P_i(S): the solve's utilisation-weighted sums with g = (P_i − p_i) on one member at a time
    _, _, each, _ = models.throughput.predict_weights(weights, units, dyn[:, None] * np.eye(2))
    per_member = [models.power.members_weighted(weights, units, each.weighted_util[:, k], factor, np.eye(2)[k])[0]
                  for k in range(2)]
    assert sum(per_member) == pytest.approx(power_w[0])
    same = tuple(DeviceMeasurement(d.name, d.steps_per_s, d.busy_power_w, d.idle_power_w, startup_s=d.startup_s,
                                   first_step_s=d.first_step_s, startup_power_w=p) for d, p in zip((a, b), per_member))
    pair = ("a", "b")
    assert _row(estimate(same, runs, JOB), pair)["energy_j"] == pytest.approx(
        _row(estimate((a, b), runs, JOB), pair)["energy_j"]
    )
    # (each alone trains at its solo power, above these in-set figures: there the start-ups are cheaper)
    assert _row(estimate(same, runs, JOB), ("a",))["energy_j"] < _row(estimate((a, b), runs, JOB), ("a",))["energy_j"]


def test_without_start_up_measurements_time_is_steps_over_throughput():
    plain = tuple(DeviceMeasurement(d.name, d.steps_per_s, d.busy_power_w, d.idle_power_w) for d in (FAST, SLOW))
    table = estimate(plain, [], JOB)
    assert _row(table, ("fast", "slow"))["time_s"] == pytest.approx(50.0 + 100.0 / 11.0)
    assert choose(table, "time").chosen == ("fast", "slow")


def test_class_aggregation_uses_the_same_start_up_model():
    fleet = tuple(DeviceMeasurement(f"f{i}", 10.0, 100.0, 50.0, class_key="f", startup_s=1.0, first_step_s=1.1,
                                    startup_power_w=70.0) for i in range(3)) + (SLOW,)
    exact = estimate(fleet, [], JOB, mode="devices")
    classes = estimate(fleet, [], JOB, mode="classes")
    by_size = {}
    for _, row in exact.iterrows():
        key = (sum(n.startswith("f") for n in row["devices"]), "slow" in row["devices"])
        by_size[key] = (row["time_s"], row["energy_j"])
    for _, row in classes.iterrows():
        key = (sum(n.startswith("f") for n in row["devices"]), "slow" in row["devices"])
        assert (row["time_s"], row["energy_j"]) == pytest.approx(by_size[key])


def test_no_remaining_steps_means_no_run():
    done = JobSpec(total_steps=20, pretrain_steps=20, pretrain_time_s=50.0)
    table = estimate((FAST, SLOW), [], done)
    assert np.allclose(table["time_s"], 50.0)


def _result(step_ends, start=100.0, warmup=2):
    return RunResult(steps_applied=len(step_ends), steps_total=len(step_ends), steps_restored=0,
                     steps_per_worker={"d": len(step_ends)}, time_s=step_ends[-1] - start, start_wall_s=start,
                     end_wall_s=step_ends[-1], step_times=[(e - 0.1, e, "d") for e in step_ends],
                     final_loss=None, lost_workers=[], checkpoint_path=None, warmup_steps=warmup)


def test_pretraining_start_up_from_a_solo_run():
    # first step back 8 s after the start, the second at 9 s, then one step every 0.5 s
    ends = [108.0, 109.0] + [109.0 + 0.5 * k for k in range(1, 9)]
    first_step_s, startup_s = _startup(_result(ends))
    assert first_step_s == pytest.approx(8.0)
    # steady rate 2 steps/s from the warm-up's end (9 s, 2 steps): the line crosses 0 at 9 − 2/2 = 8 s
    assert startup_s == pytest.approx(8.0)
    # N steps alone then take ≈ startup + N/rate: 10 steps → 13 s; measured: the 10th ends at 113 s
    assert startup_s + 10 / 2.0 == pytest.approx(ends[-1] - 100.0 + 0.0, abs=0.6)


class _Recorder:
    def __init__(self, samples):
        self.samples = samples

    def mean_power_w(self, t0, t1):
        return mean_power_between(self.samples, t0, t1)


def _samples(points):
    return [PowerSample(monotonic_s=t, wall_time_s=t, power_w=w, source="model", measured=False) for t, w in points]


def test_pretraining_start_up_power_is_the_mean_over_the_start_up():
    # 40 W for the first 8 s of the run (graph set-up), then 100 W (training), sampled every 0.5 s
    recorder = _Recorder(_samples([(100.0 + 0.5 * k, 40.0 if k <= 16 else 100.0) for k in range(40)]))
    result = _result([108.0, 109.0] + [109.0 + 0.5 * k for k in range(1, 9)])
    first_step_s, startup_s = _startup(result)
    assert _startup_power_w(recorder, result, first_step_s, startup_s) == pytest.approx(40.0)
    # a start-up too short to hold a sample: the power over the first step instead
    assert _startup_power_w(recorder, result, 9.0, 0.1) == pytest.approx((40.0 * 8.0 + 70.0 * 0.5 + 100.0 * 0.5) / 9.0)
    # nothing recorded there: not measured (0), so the planner keeps pricing it as training
    assert _startup_power_w(_Recorder([]), result, first_step_s, startup_s) == 0.0


def test_profile_keeps_start_up_and_old_profiles_read_as_zero():
    device = DeviceProfile(
        "d",
        2.0,
        0.1,
        10.0,
        5.0,
        steps=8,
        time_s=4.0,
        energy_j=40.0,
        first_step_s=8.0,
        startup_s=7.5,
        startup_power_w=7.0,
    )
    profile = Profile(model={"name": "small_cnn"}, devices=[device], runs=[], excluded={}, pretrain_steps=10,
                      pretrain_time_s=20.0, pretrain_energy_j=200.0, checkpoint_dir=None, checkpoint_path=None,
                      warmup_steps=2, steps_per_run=10, created_wall_s=0.0)
    data = profile.to_dict()
    devices, _, _ = to_planner_inputs(Profile.from_dict(data), total_steps=100)
    assert (devices[0].first_step_s, devices[0].startup_s, devices[0].startup_power_w) == (8.0, 7.5, 7.0)
    for d in data["devices"]:
        del d["first_step_s"], d["startup_s"], d["startup_power_w"]
    devices, _, _ = to_planner_inputs(Profile.from_dict(data), total_steps=100)
    assert (devices[0].first_step_s, devices[0].startup_s, devices[0].startup_power_w) == (0.0, 0.0, 0.0)

"""Start-up in the time estimate: each worker's steady line starts late, and no run ends before
every member's first step is back (hand-computed cases), and how pre-training measures both."""

import numpy as np
import pytest

from hetcluster.planner import DeviceMeasurement, JobSpec, choose, estimate
from hetcluster.profiling.pretrain import _startup
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


def test_without_start_up_measurements_time_is_steps_over_throughput():
    plain = tuple(DeviceMeasurement(d.name, d.steps_per_s, d.busy_power_w, d.idle_power_w) for d in (FAST, SLOW))
    table = estimate(plain, [], JOB)
    assert _row(table, ("fast", "slow"))["time_s"] == pytest.approx(50.0 + 100.0 / 11.0)
    assert choose(table, "time").chosen == ("fast", "slow")


def test_class_aggregation_uses_the_same_start_up_model():
    fleet = tuple(DeviceMeasurement(f"f{i}", 10.0, 100.0, 50.0, class_key="f", startup_s=1.0, first_step_s=1.1)
                  for i in range(3)) + (SLOW,)
    exact = estimate(fleet, [], JOB, mode="devices")
    classes = estimate(fleet, [], JOB, mode="classes")
    by_size = {}
    for _, row in exact.iterrows():
        key = (sum(n.startswith("f") for n in row["devices"]), "slow" in row["devices"])
        by_size[key] = row["time_s"]
    for _, row in classes.iterrows():
        key = (sum(n.startswith("f") for n in row["devices"]), "slow" in row["devices"])
        assert row["time_s"] == pytest.approx(by_size[key])


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


def test_profile_keeps_start_up_and_old_profiles_read_as_zero():
    device = DeviceProfile("d", 2.0, 0.1, 10.0, 5.0, steps=8, time_s=4.0, energy_j=40.0, first_step_s=8.0, startup_s=7.5)
    profile = Profile(model={"name": "small_cnn"}, devices=[device], runs=[], excluded={}, pretrain_steps=10,
                      pretrain_time_s=20.0, pretrain_energy_j=200.0, checkpoint_dir=None, checkpoint_path=None,
                      warmup_steps=2, steps_per_run=10, created_wall_s=0.0)
    data = profile.to_dict()
    devices, _, _ = to_planner_inputs(Profile.from_dict(data), total_steps=100)
    assert (devices[0].first_step_s, devices[0].startup_s) == (8.0, 7.5)
    for d in data["devices"]:
        del d["first_step_s"], d["startup_s"]
    devices, _, _ = to_planner_inputs(Profile.from_dict(data), total_steps=100)
    assert (devices[0].first_step_s, devices[0].startup_s) == (0.0, 0.0)

"""Profile files, calibration sets and the conversion to planner inputs, on data alone."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hetcluster.errors import ProfileError
from hetcluster.profiling.profile import (
    DeviceProfile,
    Profile,
    RunProfile,
    load_profile,
    save_profile,
    to_planner_inputs,
)
from hetcluster.profiling.sets import calibration_sets
from hetcluster.training.checkpoints import checkpoint_steps, latest_checkpoint


def _profile() -> Profile:
    return Profile(
        model={"name": "small_cnn", "input_shape": [16, 16, 3], "classes": 4, "batch_size": 8},
        devices=[DeviceProfile("a", 10.0, 0.5, 6.0, 2.0, 20, 2.0, 12.0, "model"),
                 DeviceProfile("b", 4.0, 0.2, 3.0, 1.0, 20, 5.0, 15.0, "model")],
        runs=[RunProfile(("a", "b"), 20, 1.6, 12.5, 9.0, 14.4, {"a": 15, "b": 7}, {"a": 6.0, "b": 3.0})],
        excluded={"c": "agent down"}, pretrain_steps=66, pretrain_time_s=30.0, pretrain_energy_j=80.0,
        checkpoint_dir="/ck", checkpoint_path="/ck/ckpt-66", warmup_steps=2, steps_per_run=22,
        created_wall_s=1.0, idle_power_counts=True)


def test_save_and_load_round_trip(tmp_path):
    import pandas as pd

    json_path, parquet_path = save_profile(_profile(), tmp_path / "p.json")
    assert (json_path.name, parquet_path.name) == ("p.json", "p.parquet")
    assert load_profile(parquet_path) == _profile()
    table = pd.read_parquet(parquet_path)
    assert list(table["kind"]) == ["idle", "solo", "idle", "solo", "set"]
    assert table.loc[table["kind"] == "set", "devices"].item() == "a+b"
    assert not list(tmp_path.glob(".*tmp"))  # no temporary files left behind


def test_load_rejects_missing_and_malformed(tmp_path):
    with pytest.raises(ProfileError, match="No profile"):
        load_profile(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"format_version": 1, "devices": []}))
    with pytest.raises(ProfileError, match="malformed"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ProfileError, match="version"):
        load_profile(tmp_path / "old.json")
    (tmp_path / "cluster.toml").write_text('[cluster]\nname = "x"\n')
    with pytest.raises(ProfileError, match=r"cluster\.toml is malformed"):   # not "No profile at cluster.json"
        load_profile(tmp_path / "cluster.toml")


def test_planner_inputs():
    from hetcluster.planner.inputs import validate_inputs

    devices, runs, job = to_planner_inputs(_profile(), total_steps=1000)
    validate_inputs(devices, runs, job)
    assert [(d.name, d.steps_per_s, d.busy_power_w, d.idle_power_w) for d in devices] == [
        ("a", 10.0, 6.0, 2.0), ("b", 4.0, 3.0, 1.0)]
    assert runs[0].devices == ("a", "b") and runs[0].steps_per_s == 12.5 and runs[0].power_w == 9.0
    assert (job.total_steps, job.pretrain_steps, job.remaining_steps, job.idle_power_counts) == (1000, 66, 934, True)
    assert to_planner_inputs(_profile(), 1000, idle_power_counts=False)[2].idle_power_counts is False


@pytest.mark.parametrize("rates,expected", [
    ({"a": 1.0}, []),
    ({"a": 1.0, "b": 3.0}, [("b", "a")]),
    ({"a": 1.0, "b": 3.0, "c": 2.0}, [("b", "c", "a"), ("b", "c"), ("c", "a")]),
    ({"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0}, [("d", "b", "c", "a"), ("d", "b"), ("b", "c", "a")]),
])
def test_calibration_sets(rates, expected):
    assert calibration_sets(rates) == expected
    assert calibration_sets(rates, max_sets=1) == expected[:1]


def test_calibration_sets_measure_one_set_per_composition_of_classes():
    rates = {"server": 9.0, "rpi4-1": 1.0, "rpi4-2": 1.0, "rpi4-3": 1.0}
    classes = {"server": None, "rpi4-1": "rpi4", "rpi4-2": "rpi4", "rpi4-3": "rpi4"}
    # the fastest with the slowest (server+rpi4-3) is the two fastest again (server+rpi4-1)
    assert calibration_sets(rates, max_sets=4, class_of=classes) == [
        ("server", "rpi4-1", "rpi4-2", "rpi4-3"), ("server", "rpi4-1"), ("rpi4-1", "rpi4-2", "rpi4-3")]
    assert len(calibration_sets(rates, max_sets=4)) == 4   # without classes they are different devices


def test_calibration_sets_fill_up_with_the_fastest_and_slowest_pair():
    rates = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0}
    assert calibration_sets(rates, max_sets=4)[3] == ("d", "a")


def test_checkpoint_steps_from_the_index_file(tmp_path):
    assert checkpoint_steps(tmp_path) == 0 and latest_checkpoint(None) is None
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-120"\nall_model_checkpoint_paths: "ckpt-120"\n')
    assert checkpoint_steps(tmp_path) == 120
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-120")


def test_two_solo_windows_pool_into_one_measurement_whose_error_shows_their_difference():
    from hetcluster.profiling.pretrain import pool_solo_windows

    # 2 s at 10 steps/s, then 3 s at 5 steps/s (the host slowed down between them)
    first = DeviceProfile("a", 10.0, 0.2, 6.0, 2.0, 20, 2.0, 12.0, "model", first_step_s=4.0, startup_s=3.0,
                          startup_power_w=5.0, solo_rates_steps_per_s=[10.0], solo_window_ends_s=[[0.1, 0.2]])
    second = DeviceProfile("a", 5.0, 0.1, 4.0, 2.0, 15, 3.0, 12.0, "model", first_step_s=6.0, startup_s=5.0,
                           startup_power_w=0.0, solo_rates_steps_per_s=[5.0], solo_window_ends_s=[[0.2]])
    pooled = pool_solo_windows(first, second)
    assert (pooled.steps, pooled.time_s, pooled.energy_j) == (35, 5.0, 24.0)
    assert pooled.steps_per_s == pytest.approx(7.0)  # steps over time: the longer window weighs more
    assert pooled.steps_per_s_std == pytest.approx(2.5)  # half the windows' difference, not their own 0.2 and 0.1
    assert pooled.busy_power_w == pytest.approx(24.0 / 5.0)
    assert (pooled.first_step_s, pooled.startup_s) == (5.0, 4.0)
    assert pooled.startup_power_w == 5.0  # the one window that measured it
    assert pooled.solo_rates_steps_per_s == [10.0, 5.0] and pooled.idle_power_w == 2.0
    assert pooled.solo_window_ends_s == [[0.1, 0.2], [0.2]]   # each window's completions, in order
    # windows that agree keep their own (combined) error
    steady = pool_solo_windows(first, dataclasses.replace(second, steps_per_s=10.0, steps_per_s_std=0.3))
    assert steady.steps_per_s_std == pytest.approx(((0.2 * 2.0) ** 2 + (0.3 * 3.0) ** 2) ** 0.5 / 5.0)


def test_profiles_written_before_solo_rates_were_kept_still_load():
    data = _profile().to_dict()
    for device in data["devices"]:
        del device["solo_rates_steps_per_s"], device["solo_window_ends_s"]
    loaded = Profile.from_dict(data).devices[0]
    assert loaded.solo_rates_steps_per_s == [] and loaded.solo_window_ends_s == []


def test_a_class_s_unmeasured_devices_take_the_measured_one_s_figures_and_keep_their_idle_power():
    from hetcluster.profiling.pretrain import class_copies

    board = DeviceProfile("b-1", 4.0, 0.1, 3.0, 1.0, 40, 10.0, 30.0, "model", first_step_s=2.0, startup_s=1.5,
                          device_class="board")
    lone = DeviceProfile("x", 9.0, 0.2, 6.0, 2.0, 90, 10.0, 60.0, "model")
    classes = {"b-1": "board", "x": None, "b-2": "board", "y": None}
    profiles = class_copies(
        [board, lone], ["b-2", "x", "b-1", "y"], classes, {"b-1": 1.0, "b-2": 1.2, "x": 2.0, "y": 0.5}
    )
    assert [p.name for p in profiles] == ["b-2", "x", "b-1"]   # y (no class, not measured) has no figures
    copy = profiles[0]
    assert (copy.steps_per_s, copy.first_step_s, copy.device_class, copy.measured_on) == (4.0, 2.0, "board", "b-1")
    assert copy.idle_power_w == 1.2 and profiles[2] is board and profiles[1] is lone


def test_the_cli_says_which_device_stood_for_its_class():
    from hetcluster.cli.pretraining import class_copy_lines

    profile = _profile()
    assert class_copy_lines(profile) == []
    profile.devices[1].measured_on = "a"
    assert class_copy_lines(profile) == ["  measured once for its class: a stands for b"]


def test_rates_measured_under_a_memory_plan_reach_the_planner_as_plain_rates():
    """A run trained under a memory plan (pre-training gives a device that plain TensorFlow does
    not fit its plan) is handed to the planner as plain TF would train: its rates times the plan's
    predicted slowdown, which the planner divides out again, so the device's own plan reproduces
    what was measured."""
    from hetcluster.planner import estimate

    profile = _profile()
    profile.devices[1] = dataclasses.replace(profile.devices[1], memory_plan="recompute_conv", memory_slowdown=1.25)
    profile.runs[0] = dataclasses.replace(profile.runs[0], memory_plan="recompute_conv", memory_slowdown=1.25)
    devices, runs, job = to_planner_inputs(profile, total_steps=1000)
    assert devices[0].steps_per_s == 10.0 and devices[1].steps_per_s == pytest.approx(5.0)
    assert devices[1].steps_per_s_std == pytest.approx(0.25)
    assert runs[0].steps_per_s == pytest.approx(12.5 * 1.25) and runs[0].time_s == pytest.approx(1.6 / 1.25)
    assert runs[0].per_device_steps == {"a": 15, "b": 7}  # over the shorter time: each rate × 1.25
    # with b's plan charged (cli.pretraining.planner_inputs fills it in), b alone is what it measured
    devices = [dataclasses.replace(d, memory_slowdown=1.25) if d.name == "b" else d for d in devices]
    table = estimate(devices, [], job).set_index("devices")
    assert table.loc[[("b",)], "steps_per_s"].iloc[0] == pytest.approx(4.0)
    assert table.loc[[("a",)], "steps_per_s"].iloc[0] == pytest.approx(10.0)
    # kept in the profile, and profiles written before it load as plain
    assert Profile.from_dict(profile.to_dict()) == profile
    data = _profile().to_dict()
    for record in (*data["devices"], *data["runs"]):
        del record["memory_plan"], record["memory_slowdown"]
    assert Profile.from_dict(data).devices[1].memory_slowdown == 1.0


def test_a_set_whose_members_ran_their_own_plans_reaches_the_planner_member_by_member():
    """Each member of a calibration set trains under its own plan (b under ×1.25, a plain): b's
    steps are multiplied back by its slowdown, a's are not, and the set's rate by their weighed mean."""
    profile = _profile()
    profile.runs[0] = dataclasses.replace(profile.runs[0], memory_plan="recompute_conv", memory_slowdown=1.25,
                                          memory_slowdowns={"a": 1.0, "b": 1.25})
    _, runs, _ = to_planner_inputs(profile, total_steps=1000)
    assert runs[0].per_device_steps == {"a": 15, "b": pytest.approx(7 * 1.25)}
    assert runs[0].time_s == pytest.approx(1.6)
    assert runs[0].steps_per_s == pytest.approx(12.5 * (15 + 7 * 1.25) / 22)
    assert Profile.from_dict(profile.to_dict()) == profile

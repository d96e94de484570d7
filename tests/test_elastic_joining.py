"""Where an elastic job takes a joining device's figures from before it would measure it
(cli/joining.known_figures): measured earlier in the job, the job's profile, a device of its class."""

from __future__ import annotations

from pathlib import Path

from hetcluster.cli.joining import known_figures
from hetcluster.inventory import inventory_from_mapping
from hetcluster.profiling.profile import DeviceProfile, Profile


def _device(name: str, rate: float, device_class: str | None = None) -> DeviceProfile:
    return DeviceProfile(name=name, steps_per_s=rate, steps_per_s_std=0.1, busy_power_w=5.0, idle_power_w=1.0,
                         steps=20, time_s=2.0, energy_j=10.0, device_class=device_class)


def _fleet(*entries: tuple[str, str | None]):
    devices = [{"name": name, "address": f"127.0.0.1:{50001 + i}", "token_file": "token",
                **({"device_class": cls} if cls else {})}
               for i, (name, cls) in enumerate(entries)]
    return inventory_from_mapping({"devices": devices}, base_dir=Path("."), check_credentials=False)


def test_figures_come_from_the_job_before_any_measurement():
    profile = Profile(model={}, devices=[_device("a", 10.0), _device("rpi4-1", 3.0, "rpi4")], runs=[], excluded={},
                      pretrain_steps=0, pretrain_time_s=0.0, pretrain_energy_j=0.0, checkpoint_dir=None,
                      checkpoint_path=None, warmup_steps=2, steps_per_run=20, created_wall_s=0.0)
    fleet = _fleet(("a", None), ("rpi4-1", "rpi4"), ("rpi4-2", "rpi4"), ("c", None), ("new", None))
    assert known_figures("a", fleet, profile, {}).source == "this job's profile"
    earlier = known_figures("c", fleet, profile, {"c": _device("c", 40.0)})
    assert earlier.source == "measured earlier in this job" and earlier.device.steps_per_s == 40.0
    copied = known_figures("rpi4-2", fleet, profile, {})
    assert copied.device.name == "rpi4-2" and copied.device.measured_on == "rpi4-1"
    assert copied.device.steps_per_s == 3.0 and copied.source.startswith("its class (rpi4")
    assert known_figures("new", fleet, profile, {}) is None      # it must be measured

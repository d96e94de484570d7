"""The pre-training profile: what each device and calibration set measured, stored and converted.

Written as a JSON summary (complete, authoritative, read back by ``load_profile``) and a Parquet
table with one row per measurement (kind ``idle``/``solo``/``startup``/``set``) for analysis with pandas.
Both files are written atomically (temporary file + ``os.replace``). ``to_planner_inputs`` turns a
profile into the planner's ``DeviceMeasurement``/``RunMeasurement``/``JobSpec``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetcluster.errors import ProfileError
from hetcluster.fileio import write_bytes_atomic

FORMAT_VERSION = 1


@dataclass
class DeviceProfile:
    """One device alone: applied steps/s after warm-up, its spread, busy and idle power.

    ``first_step_s``: from the run's start (the coordinator scheduling its first step, the server
    already up) to the device's first completed step — graph instantiation and the first, slow
    step. ``startup_s``: where the steady line count(t) = steps_per_s·(t − startup_s) through the
    end of the warm-up crosses zero, so a run of N steps lasts about startup_s + N/steps_per_s.
    ``startup_power_w``: the device's mean power over that start-up (graph set-up draws other power
    than training: less on a fast device waiting on one Python thread, more on a board whose
    set-up saturates its cores). All three 0 in profiles written before they were recorded.
    ``solo_rates_steps_per_s``: each solo window's own rate, in order, when the device was
    measured alone more than once (pretrain.pool_solo_windows); the figures above pool them.
    ``device_class``: the inventory's class of identical devices (None: a class of its own); the
    planner lists a class's devices as counts (docs/planner.md, "Scale"). ``measured_on``: the
    device of the same class whose solo run these figures are ("": this device's own); only the
    idle power is its own. ``memory_plan``: the memory scheduler's technique the solo run trained
    under, where plain TensorFlow does not fit the device ("": plain), and ``memory_slowdown`` its
    predicted step-time multiplier: the figures above are as measured, under that plan.
    ``solo_window_ends_s``: each solo window's step completions, in seconds from the window's open
    (one list per window, in order; empty in profiles written before they were recorded), so what a
    shorter window would have read on the same run can be worked out afterwards
    (`python -m experiments.investigations.solo_rates`). ``measured_wall_s``: when the solo figures
    were measured, for a device known from an earlier pre-training of the same job
    (profiling/known.py); 0 when this pre-training measured it.
    """

    name: str
    steps_per_s: float
    steps_per_s_std: float
    busy_power_w: float
    idle_power_w: float
    steps: int
    time_s: float
    energy_j: float
    power_source: str = ""
    first_step_s: float = 0.0
    startup_s: float = 0.0
    startup_power_w: float = 0.0
    solo_rates_steps_per_s: list[float] = field(default_factory=list)
    device_class: str | None = None
    measured_on: str = ""
    memory_plan: str = ""
    memory_slowdown: float = 1.0
    solo_window_ends_s: list[list[float]] = field(default_factory=list)
    measured_wall_s: float = 0.0


@dataclass
class RunProfile:
    """One measured run of a set of devices together (warm-up excluded from time and power), each
    member under its own memory plan where plain TensorFlow does not fit it (``memory_plan``: the
    techniques; ``memory_slowdowns``: each member's predicted step-time multiplier). Profiles from
    releases that ran every member under the tightest member's plan have only ``memory_slowdown``,
    that plan's multiplier, for every member."""

    devices: tuple[str, ...]
    steps: int
    time_s: float
    steps_per_s: float
    power_w: float
    energy_j: float
    # each member's own rate in the set times ``time_s``, as the planner reads it back (÷ time_s);
    # not rounded to whole steps: a board holds 2-5 steps in a short set window, where rounding
    # moved its rate by up to a quarter (profiles before this kept whole numbers)
    per_device_steps: dict[str, float] = field(default_factory=dict)
    per_device_power_w: dict[str, float] = field(default_factory=dict)
    memory_plan: str = ""
    memory_slowdown: float = 1.0
    memory_slowdowns: dict[str, float] = field(default_factory=dict)

    def slowdown_of(self, device: str) -> float:
        return self.memory_slowdowns.get(device, 1.0) if self.memory_slowdowns else self.memory_slowdown

    def plain_scale(self) -> float:
        """What the run's throughput is multiplied by to read as plain TensorFlow's: each member's
        rate by its own plan's slowdown, weighed by its share of the steps."""
        if not self.memory_slowdowns:
            return self.memory_slowdown
        steps = {n: self.per_device_steps.get(n, 0.0) for n in self.devices}
        total = sum(steps.values())
        if total <= 0:
            return sum(self.slowdown_of(n) for n in self.devices) / max(len(self.devices), 1)
        return sum(s * self.slowdown_of(n) for n, s in steps.items()) / total


@dataclass
class Profile:
    """Everything pre-training measured, and where the job's checkpoint stands after it."""

    model: dict[str, Any]
    devices: list[DeviceProfile]
    runs: list[RunProfile]
    excluded: dict[str, str]
    pretrain_steps: int
    pretrain_time_s: float
    pretrain_energy_j: float
    checkpoint_dir: str | None
    checkpoint_path: str | None
    warmup_steps: int
    steps_per_run: int
    created_wall_s: float
    idle_power_counts: bool = False
    warmup_s: float = 0.0   # and each worker's steps in these seconds after warmup_steps (0 in older profiles)
    # the model's layer graph at batch 1 (LayerGraph.to_dict) that pre-training's memory plans were
    # made on; None where no plan was made (no memory budget known) and in older profiles.
    # Planning from the profile adopts it for this model, input shape and classes, so it builds no model
    memory_graph: dict[str, Any] | None = None
    # what the pre-training trained on (training.spec.Training.recorded): data, optimizer, learning
    # rate; its checkpoint carries them into the job, which must train on the same
    training: dict[str, Any] = field(default_factory=dict)
    loss_curve: list[dict[str, float]] = field(default_factory=list)   # its runs' training loss (RunResult.loss_curve)

    def device(self, name: str) -> DeviceProfile:
        for device in self.devices:
            if device.name == name:
                return device
        raise ProfileError(f"Device {name!r} is not in the profile.", hint="re-run pre-training with that device.")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format_version"] = FORMAT_VERSION
        for run in data["runs"]:
            run["devices"] = list(run["devices"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        data = dict(data)
        if data.pop("format_version", None) != FORMAT_VERSION:
            raise ProfileError("Profile has an unknown format version.", hint="re-run `hetcluster profile`.")
        data["devices"] = [DeviceProfile(**d) for d in data["devices"]]
        data["runs"] = [RunProfile(**{**r, "devices": tuple(r["devices"])}) for r in data["runs"]]
        return cls(**data)

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per measurement, for the Parquet table (a device whose figures were measured
        on another of its class has its idle row only: its solo rows are that device's)."""
        rows = []
        for d in self.devices:
            rows.append({"kind": "idle", "devices": d.name, "num_devices": 1, "steps": 0, "time_s": 0.0,
                         "steps_per_s": 0.0, "steps_per_s_std": 0.0, "power_w": d.idle_power_w, "energy_j": 0.0,
                         "memory_plan": ""})
            if d.measured_on:
                continue
            rows.append({"kind": "solo", "devices": d.name, "num_devices": 1, "steps": d.steps, "time_s": d.time_s,
                         "steps_per_s": d.steps_per_s, "steps_per_s_std": d.steps_per_s_std,
                         "power_w": d.busy_power_w, "energy_j": d.energy_j, "memory_plan": d.memory_plan})
            if d.startup_power_w > 0:  # the solo run's start-up, where it was measured
                rows.append({"kind": "startup", "devices": d.name, "num_devices": 1, "steps": 0, "time_s": d.startup_s,
                             "steps_per_s": 0.0, "steps_per_s_std": 0.0, "power_w": d.startup_power_w,
                             "energy_j": d.startup_power_w * d.startup_s, "memory_plan": d.memory_plan})
        for r in self.runs:
            rows.append({"kind": "set", "devices": "+".join(r.devices), "num_devices": len(r.devices),
                         "steps": r.steps, "time_s": r.time_s, "steps_per_s": r.steps_per_s, "steps_per_s_std": 0.0,
                         "power_w": r.power_w, "energy_j": r.energy_j, "memory_plan": r.memory_plan})
        return rows


def save_profile(profile: Profile, path: Path | str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.parquet`` next to ``path``; return both paths."""
    import io

    import pandas as pd

    base = Path(path)
    stem = base.with_suffix("") if base.suffix in (".json", ".parquet") else base
    json_path, parquet_path = stem.with_suffix(".json"), stem.with_suffix(".parquet")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    pd.DataFrame(profile.rows()).to_parquet(buffer, index=False)
    write_bytes_atomic(parquet_path, buffer.getvalue())
    write_bytes_atomic(json_path, json.dumps(profile.to_dict(), indent=2).encode("utf-8"))
    return json_path, parquet_path


def load_profile(path: Path | str) -> Profile:
    """Read a profile from its JSON summary (a ``.parquet`` path is mapped to its ``.json``)."""
    base = Path(path)
    json_path = base.with_suffix(".json") if base.suffix == ".parquet" else base
    try:
        return Profile.from_dict(json.loads(json_path.read_text(encoding="utf-8")))
    except FileNotFoundError as exc:
        raise ProfileError(
            f"No profile at {json_path}.", hint="run `hetcluster profile` or pass --profile FILE."
        ) from exc
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ProfileError(f"Profile {json_path} is malformed: {exc}.", hint="re-run `hetcluster profile`.") from exc


def _as_plain(run: RunProfile) -> Any:
    """A run's measurement as plain TensorFlow would have trained it: each member's steps (a rate
    times the window) multiplied by its own plan's slowdown, the set's rate by their weighed mean."""
    from hetcluster.planner.inputs import RunMeasurement

    if not run.memory_slowdowns:  # one plan for every member: the window shrinks by its slowdown
        return RunMeasurement(devices=tuple(run.devices), steps=run.steps, time_s=run.time_s / run.memory_slowdown,
                              steps_per_s=run.steps_per_s * run.memory_slowdown, power_w=run.power_w,
                              per_device_steps=dict(run.per_device_steps),
                              per_device_power_w=dict(run.per_device_power_w))
    return RunMeasurement(devices=tuple(run.devices), steps=round(run.steps * run.plain_scale()), time_s=run.time_s,
                          steps_per_s=run.steps_per_s * run.plain_scale(), power_w=run.power_w,
                          per_device_steps={n: s * run.slowdown_of(n) for n, s in run.per_device_steps.items()},
                          per_device_power_w=dict(run.per_device_power_w))


def to_planner_inputs(profile: Profile, total_steps: int, idle_power_counts: bool | None = None) -> tuple[Any, ...]:
    """``(devices, runs, job)`` for the planner, from a profile and the job's total steps."""
    from hetcluster.planner.inputs import DeviceMeasurement, JobSpec

    # the planner takes rates as plain TensorFlow would train (it divides each member's by its own
    # plan's slowdown itself): a run measured under plans has its rates multiplied back by them
    # (1 where it ran plain), so a device's own plan reproduces its measurement
    devices = [
        DeviceMeasurement(
            name=d.name,
            steps_per_s=d.steps_per_s * d.memory_slowdown,
            busy_power_w=d.busy_power_w,
            idle_power_w=d.idle_power_w,
            steps_per_s_std=d.steps_per_s_std * d.memory_slowdown,
            first_step_s=d.first_step_s,
            startup_s=d.startup_s,
            startup_power_w=d.startup_power_w,
            class_key=d.device_class,
        )
        for d in profile.devices
    ]
    runs = [_as_plain(r) for r in profile.runs]
    job = JobSpec(total_steps=int(total_steps), pretrain_steps=profile.pretrain_steps,
                  pretrain_time_s=profile.pretrain_time_s, pretrain_energy_j=profile.pretrain_energy_j,
                  idle_power_counts=profile.idle_power_counts if idle_power_counts is None else idle_power_counts)
    return devices, runs, job

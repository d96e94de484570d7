"""Recorded pre-training traces: one CSV row per measured configuration, replayed in tests.

Format (CSV with a header; extra columns are ignored):

    devices          device names joined by '+', e.g. "server+jetson-nano"
    steps            applied steps in the run (warm-up excluded)
    time_s           duration of those steps
    steps_per_s      aggregate applied steps/s
    power_w          summed mean power of the participating devices
    idle_power_w     (single-device rows) the device's idle power
    steps_per_s_std  (optional, single-device rows) spread of the solo throughput
    class_key        (optional, single-device rows)
    per_device_steps (optional) JSON object {"name": steps}: each member's own rate × time_s (may be fractional)

Single-device rows define the DeviceMeasurement of that device (and are runs too); every row is
a RunMeasurement. The same format holds synthetic traces (named so: synthetic_*.csv) and real
traces recorded on the emulated cluster.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from hetcluster.errors import ProfileError
from hetcluster.fileio import write_text_atomic
from hetcluster.planner.inputs import DeviceMeasurement, RunMeasurement

REQUIRED_COLUMNS = ("devices", "steps", "time_s", "steps_per_s", "power_w")


def _float(value, default: float = 0.0) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(out) else out


def load_trace(path: str | Path) -> tuple[tuple[DeviceMeasurement, ...], tuple[RunMeasurement, ...]]:
    """Read a trace CSV → (devices measured alone, all runs)."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype={"devices": str, "class_key": str, "per_device_steps": str})
    except (OSError, ValueError) as error:
        raise ProfileError(
            f"Cannot read trace {path}: {error}.", hint="check the path and that it is a CSV file."
        ) from error
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ProfileError(
            f"Trace {path} lacks columns: {', '.join(missing)}.", hint=f"a trace needs {', '.join(REQUIRED_COLUMNS)}."
        )
    devices: dict[str, DeviceMeasurement] = {}
    runs: list[RunMeasurement] = []
    for line, row in enumerate(frame.to_dict("records"), start=2):
        names = tuple(n.strip() for n in str(row["devices"]).split("+") if n.strip())
        if not names:
            raise ProfileError(f"Trace {path} line {line}: no devices.", hint="write device names joined by '+'.")
        per_device = row.get("per_device_steps")
        per_device_steps = json.loads(per_device) if isinstance(per_device, str) and per_device.strip() else {}
        run = RunMeasurement(
            devices=names,
            steps=int(row["steps"]),
            time_s=_float(row["time_s"]),
            steps_per_s=_float(row["steps_per_s"]),
            power_w=_float(row["power_w"]),
            per_device_steps={str(k): float(v) for k, v in per_device_steps.items()},
        )
        runs.append(run)
        if len(names) == 1 and names[0] not in devices:
            key = row.get("class_key")
            devices[names[0]] = DeviceMeasurement(
                name=names[0],
                steps_per_s=run.steps_per_s,
                busy_power_w=run.power_w,
                idle_power_w=_float(row.get("idle_power_w")),
                class_key=key if isinstance(key, str) and key else None,
                steps_per_s_std=_float(row.get("steps_per_s_std")),
            )
    missing_solo = sorted({n for r in runs for n in r.devices} - set(devices))
    if missing_solo:
        raise ProfileError(
            f"Trace {path} has no single-device row for: {', '.join(missing_solo)}.",
            hint="every device must also be measured alone.",
        )
    return tuple(devices.values()), tuple(runs)


def write_trace(path: str | Path, devices, runs) -> None:
    """Write devices and runs in the trace format (atomically: temp file + os.replace)."""
    by_name = {d.name: d for d in devices}
    rows = []
    for run in runs:
        solo = by_name.get(run.devices[0]) if len(run.devices) == 1 else None
        rows.append({
            "devices": "+".join(run.devices),
            "steps": run.steps,
            "time_s": run.time_s,
            "steps_per_s": run.steps_per_s,
            "power_w": run.power_w,
            "idle_power_w": solo.idle_power_w if solo else "",
            "steps_per_s_std": solo.steps_per_s_std if solo else "",
            "class_key": (solo.class_key or "") if solo else "",
            "per_device_steps": json.dumps(run.per_device_steps) if run.per_device_steps else "",
        })
    write_text_atomic(path, pd.DataFrame(rows).to_csv(index=False))

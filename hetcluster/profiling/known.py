"""Devices measured before, kept across jobs, so that a known device is not measured alone again.

Every pre-training adds each device it measured alone to a store, one JSON line per device and
job. A later pre-training of a job with the same model, input shape, classes, batch size, data
kind and optimizer, on a device with the same fingerprint (its name and the hardware its agent
reports), takes that device's solo figures instead of a solo run while they are younger than
``MAX_AGE_S``, and says how old they are. Idle power is read afresh, and the fleet's calibration
set is always measured: how devices slow each other depends on which train together.

The store is ``$HETCLUSTER_MEASUREMENTS`` ("off": none), else
``$XDG_STATE_HOME/hetcluster/measurements.jsonl`` (``~/.local/state/...``). Lines are appended
whole, so a reader never sees half a record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from hetcluster.profiling.profile import DeviceProfile

log = logging.getLogger(__name__)

STORE_ENV = "HETCLUSTER_MEASUREMENTS"
# a week: a fleet measured for yesterday's job plans today's at the cost of its sets alone
MAX_AGE_S = 7 * 24 * 3600.0
# what a device's solo figures depend on, besides the job
_FINGERPRINT_FIELDS = ("hostname", "platform", "architecture", "cpu_model", "cpu_count", "memory_bytes",
                       "device_kind", "compute_share", "emulated")


def store_path() -> Path | None:
    """Where known devices are kept (None: nowhere)."""
    explicit = os.environ.get(STORE_ENV, "").strip()
    if explicit == "off":
        return None
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME", "").strip() or str(Path.home() / ".local" / "state")
    return Path(state) / "hetcluster" / "measurements.jsonl"


def job_key(model: Mapping[str, Any], training: Mapping[str, Any]) -> str:
    """What a step's time and power depend on, of the job: the model (its config's digest for a
    user's model), input shape, classes, batch size, the data's kind and the optimizer."""
    data = training.get("data") or {}
    parts = {key: model.get(key) for key in ("name", "input_shape", "classes", "batch_size")}
    parts.update(keras_config=bool(model.get("keras_config")), data_kind=data.get("kind", "synthetic"),
                 optimizer=training.get("optimizer", "sgd"))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=list).encode()).hexdigest()[:16]


def fingerprint(name: str, info: Any) -> str | None:
    """A device's name and the hardware its agent reports (None when it reported nothing)."""
    if info is None:
        return None
    parts = {"name": name, **{key: getattr(info, key, None) for key in _FINGERPRINT_FIELDS},
             "accelerators": sorted(str(getattr(a, "name", a)) for a in getattr(info, "accelerators", ()) or ())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def remember(devices: Iterable[DeviceProfile], job: str, fingerprints: Mapping[str, str | None],
             path: Path | None = None) -> int:
    """Add each device measured alone in this pre-training (not a class copy, not itself known
    from before) to the store; returns how many. A store that cannot be written is a warning."""
    path = path or store_path()
    if path is None:
        return 0
    lines = []
    now = time.time()
    for device in devices:
        key = fingerprints.get(device.name)
        if key is None or device.measured_on or device.measured_wall_s:
            continue
        record = {"job": job, "device": key, "measured_wall_s": now, "profile": dataclasses.asdict(device)}
        lines.append(json.dumps(record) + "\n")
    if not lines:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as store:
            store.write("".join(lines))
    except OSError as error:
        log.warning("could not keep the devices' measurements in %s: %s", path, error)
        return 0
    return len(lines)


def known_devices(job: str, fingerprints: Mapping[str, str | None], max_age_s: float = MAX_AGE_S,
                  path: Path | None = None, now: float | None = None) -> dict[str, DeviceProfile]:
    """Each device of ``fingerprints`` measured alone for ``job`` within ``max_age_s``: its latest
    solo figures, ``measured_wall_s`` set to when they were measured."""
    path = path or store_path()
    found: dict[str, DeviceProfile] = {}
    if path is None:
        return found
    now = time.time() if now is None else now
    wanted = {key: name for name, key in fingerprints.items() if key is not None}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return found
    for line in text.splitlines():
        try:
            record = json.loads(line)
            name = wanted.get(record["device"])
            if record["job"] != job or name is None or now - float(record["measured_wall_s"]) > max_age_s:
                continue
            profile = DeviceProfile(**{**record["profile"], "name": name,
                                       "measured_wall_s": float(record["measured_wall_s"])})
        except (ValueError, KeyError, TypeError):
            continue   # a line of another version, or damaged: not a known device
        if name not in found or profile.measured_wall_s >= found[name].measured_wall_s:
            found[name] = profile
    return found


def age_text(seconds: float) -> str:
    """How old, in the largest unit that reads well."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"

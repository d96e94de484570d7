"""The device catalog: what each emulated device is (share, memory, watts, link), from TOML.

The built-in catalog (catalog.toml next to this file) documents a source or rationale for every
number; a user catalog passed with ``--catalog`` adds profiles or overrides single fields of
built-in ones. Parsing is strict (unknown keys are errors) because a misspelt key would otherwise
silently give a device the default share. ``check_fleet_fits`` refuses fleets whose shares add up
to more CPU cores than this machine has: quotas above the machine would no longer slow a device
by its share, and the step-time ratios the planner measures would lie.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from hetcluster.errors import ConfigError, EmulationError

log = logging.getLogger(__name__)

BUILTIN_CATALOG = Path(__file__).with_name("catalog.toml")
DEFAULT_FLEET = ("server", "jetson-xavier", "jetson-nano", "rpi4", "phone")

_NUMBER_FIELDS = (
    "compute_share",
    "memory_budget_bytes",
    "idle_w",
    "busy_w",
    "link_bandwidth_mbit_per_s",
    "link_latency_ms",
)
_PROFILE_KEYS = set(_NUMBER_FIELDS) | {"description", "rationale"}


@dataclass(frozen=True)
class DeviceProfile:
    """One kind of device the emulator can stand in for."""

    name: str
    compute_share: float
    memory_budget_bytes: int
    idle_w: float
    busy_w: float
    link_bandwidth_mbit_per_s: float
    link_latency_ms: float
    description: str = ""
    rationale: Mapping[str, str] = field(default_factory=dict)
    profile_name: str = ""   # the catalog profile a numbered copy (rpi4-2) instantiates; "" = name

    @property
    def catalog_name(self) -> str:
        """The catalog profile this device is: its own name, or the profile a numbered copy repeats."""
        return self.profile_name or self.name

    @property
    def link_bandwidth_bytes_per_s(self) -> float:
        return self.link_bandwidth_mbit_per_s * 1e6 / 8.0

    @property
    def link_latency_s(self) -> float:
        return self.link_latency_ms / 1000.0


class Catalog(dict[str, DeviceProfile]):
    """Profiles by name, with a helpful error for names that are not there."""

    def select(self, names: Iterable[str]) -> list[DeviceProfile]:
        """The profiles named, in order. A profile named more than once (``rpi4,rpi4`` or
        ``rpi4*2``) stands for that many identical devices, numbered ``rpi4-1``, ``rpi4-2``, ...;
        each copy keeps the profile's name in ``profile_name``, so the inventory gives them one
        device class."""
        wanted = [name for entry in names for name in _expand(entry)]
        for name in wanted:
            if name not in self:
                raise ConfigError(
                    f"no device profile {name!r} in the catalog.",
                    hint=f"use one of: {', '.join(sorted(self))}, or add it with --catalog my.toml.",
                )
        counts = Counter(wanted)
        numbered: Counter[str] = Counter()
        chosen: list[DeviceProfile] = []
        for name in wanted:
            if counts[name] == 1:
                chosen.append(self[name])
                continue
            numbered[name] += 1
            chosen.append(replace(self[name], name=f"{name}-{numbered[name]}", profile_name=name))
        clash = sorted(name for name, n in Counter(p.name for p in chosen).items() if n > 1)
        if clash:
            raise ConfigError(f"device name {clash[0]!r} would stand for two devices (a profile of that name and a "
                              "numbered copy).", hint="rename that catalog profile.")
        return chosen


def _expand(entry: str) -> list[str]:
    """``NAME*COUNT`` → COUNT × NAME; a plain name → itself."""
    name, star, count = entry.partition("*")
    if not star:
        return [entry]
    if not count.strip().isdigit() or int(count) < 1:
        raise ConfigError(
            f"--devices entry {entry!r} needs a count of 1 or more after '*'.", hint="write NAME*COUNT, e.g. rpi4*3."
        )
    return [name.strip()] * int(count)


def load_catalog(extra: Path | str | None = None, builtin: Path = BUILTIN_CATALOG) -> Catalog:
    """The built-in profiles, then those of ``extra`` (new ones, or field overrides of built-ins)."""
    catalog = Catalog()
    for name, raw in _read_profiles(builtin).items():
        catalog[name] = _profile(name, raw, builtin, base=None)
    if extra is not None:
        for name, raw in _read_profiles(Path(extra)).items():
            log.info("catalog %s: profile %s %s", extra, name, "overridden" if name in catalog else "added")
            catalog[name] = _profile(name, raw, Path(extra), base=catalog.get(name))
    return catalog


def available_cores() -> float:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return float(os.cpu_count() or 1)


def check_fleet_fits(profiles: Iterable[DeviceProfile], cores: float | None = None) -> float:
    """Return the shares' sum; raise EmulationError when it exceeds the machine's cores."""
    chosen = list(profiles)
    total = sum(p.compute_share for p in chosen)
    limit = available_cores() if cores is None else cores
    if total > limit + 1e-9:
        detail = ", ".join(f"{p.name} {p.compute_share:g}" for p in chosen)
        raise EmulationError(
            f"the fleet needs {total:g} CPU cores ({detail}) but this machine has {limit:g}: "
            f"oversubscribed by {total - limit:g} cores.",
            hint="drop devices from --devices or lower compute_share in a --catalog file.",
        )
    return total


def _read_profiles(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read catalog {path}: {error.strerror}.", hint="check the --catalog path.") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"catalog {path} is not valid TOML: {error}.", hint="fix the syntax there.") from None
    unknown = sorted(set(data) - {"profiles"})
    if unknown:
        raise ConfigError(
            f"catalog {path}: unknown top-level key {', '.join(unknown)}.",
            hint="put each device under [profiles.<name>].",
        )
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict) or not profiles:
        raise ConfigError(
            f"catalog {path} has no [profiles.<name>] tables.", hint="see docs/emulation.md for the format."
        )
    return profiles


def _profile(name: str, raw: Any, path: Path, base: DeviceProfile | None) -> DeviceProfile:
    where = f"catalog {path}: profile {name!r}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} is not a table.", hint=f"write it as [profiles.{name}].")
    unknown = sorted(set(raw) - _PROFILE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {', '.join(unknown)}.", hint=f"allowed: {', '.join(sorted(_PROFILE_KEYS))}."
        )
    values: dict[str, Any] = {}
    for key in _NUMBER_FIELDS:
        if key not in raw:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{where}: {key} must be a non-negative number, got {value!r}.", hint="give a number.")
        values[key] = int(value) if key == "memory_budget_bytes" else float(value)
    rationale = raw.get("rationale", {})
    if not isinstance(rationale, dict) or not all(isinstance(v, str) for v in rationale.values()):
        raise ConfigError(f"{where}: rationale must be a table of strings.", hint="one line per number.")
    stray = sorted(set(rationale) - set(_NUMBER_FIELDS))
    if stray:
        raise ConfigError(
            f"{where}: rationale for unknown field {', '.join(stray)}.", hint=f"fields: {', '.join(_NUMBER_FIELDS)}."
        )
    description = raw.get("description", base.description if base else "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string.", hint="quote it.")
    if base is not None:
        merged_rationale = {**base.rationale, **rationale}
        profile = replace(base, description=description, rationale=merged_rationale, **values)
    else:
        missing = [key for key in _NUMBER_FIELDS if key not in values]
        if missing:
            raise ConfigError(f"{where}: missing {', '.join(missing)}.", hint="a new profile must set every number.")
        profile = DeviceProfile(name=name, description=description, rationale=dict(rationale), **values)
    if profile.compute_share <= 0:
        raise ConfigError(f"{where}: compute_share must be above 0.", hint="e.g. 0.25 for a quarter of a core.")
    if profile.busy_w < profile.idle_w:
        raise ConfigError(f"{where}: busy_w {profile.busy_w:g} is below idle_w {profile.idle_w:g}.", hint="swap them.")
    if profile.link_bandwidth_mbit_per_s <= 0:
        raise ConfigError(
            f"{where}: link_bandwidth_mbit_per_s must be above 0.", hint="e.g. 1000 for Gigabit Ethernet."
        )
    if profile.memory_budget_bytes <= 0:
        raise ConfigError(f"{where}: memory_budget_bytes must be above 0.", hint="e.g. 4294967296 for 4 GiB.")
    return profile


__all__ = [
    "BUILTIN_CATALOG",
    "Catalog",
    "DEFAULT_FLEET",
    "DeviceProfile",
    "available_cores",
    "check_fleet_fits",
    "load_catalog",
]

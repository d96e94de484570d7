"""Typed power settings, the list of available sources, and the factory that opens one.

``auto`` prefers measurements, in this order: RAPL and NVML together when both exist (they measure
disjoint parts of one host: CPU package/DRAM and GPU boards), either alone, then a Jetson's INA3221,
a Raspberry Pi 5's PMIC, an Android battery (skipped while plugged in), and finally the CPU
utilization model. Emulated devices name ``source = "emulated"``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from hetcluster.errors import ConfigError, PowerSourceError
from hetcluster.power import android, jetson, model, nvml, pi5, rapl
from hetcluster.power.base import Availability, PowerSource
from hetcluster.power.combined import CombinedSource
from hetcluster.power.emulated import EmulatedPowerSource

log = logging.getLogger(__name__)

MEASURED_SOURCES = (rapl.NAME, nvml.NAME, jetson.NAME, pi5.NAME, android.NAME)
SOURCE_NAMES = ("auto", *MEASURED_SOURCES, model.NAME, "emulated")
_KEYS = ("source", "idle_w", "busy_w", "compute_share", "cgroup_dir", "root_pid")


@dataclass(frozen=True)
class PowerConfig:
    """The ``[power]`` table: which source, and the watts a model uses.

    ``idle_w``/``busy_w`` feed the model sources (utilization model: optional, TDP table otherwise;
    emulated: required). ``compute_share``, ``cgroup_dir`` and ``root_pid`` only matter for
    ``source = "emulated"``; the agent fills them from its ``[emulation]`` table with
    ``for_emulation``.
    """

    source: str = "auto"
    idle_w: float | None = None
    busy_w: float | None = None
    compute_share: float | None = None
    cgroup_dir: Path | None = None
    root_pid: int | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCE_NAMES:
            raise ConfigError(
                f"power.source {self.source!r} is unknown.", hint=f"use one of {', '.join(SOURCE_NAMES)}."
            )
        for key in ("idle_w", "busy_w"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(
                    f"power.{key} must be a non-negative number of watts, got {value!r}.", hint=f"fix power.{key}."
                )
        if self.idle_w is not None and self.busy_w is not None and self.idle_w > self.busy_w:
            raise ConfigError(
                f"power.idle_w ({self.idle_w}) is above power.busy_w ({self.busy_w}).", hint="swap or fix them."
            )
        share = self.compute_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or share <= 0):
            raise ConfigError(f"power.compute_share must be a positive number of cores, got {share!r}.", hint="fix it.")
        pid = self.root_pid
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise ConfigError(f"power.root_pid must be a positive process id, got {pid!r}.", hint="fix it.")
        if self.source == "emulated":
            missing = [k for k in ("idle_w", "busy_w", "compute_share") if getattr(self, k) is None]
            if missing:
                raise ConfigError(
                    f"power.source = \"emulated\" needs {', '.join(missing)}.",
                    hint="set idle_w and busy_w in [power] and compute_share in [emulation].",
                )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PowerConfig":
        """Validate a parsed ``[power]`` table (ConfigError naming the bad key)."""
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ConfigError(
                f"Unknown key(s) in [power]: {', '.join(unknown)}.", hint=f"allowed keys: {', '.join(_KEYS)}."
            )
        values = dict(data)
        source = values.get("source", "auto")
        if not isinstance(source, str):
            raise ConfigError(
                f"power.source must be a string, got {source!r}.", hint=f"use one of {', '.join(SOURCE_NAMES)}."
            )
        if values.get("cgroup_dir") is not None:
            if not isinstance(values["cgroup_dir"], (str, Path)):
                raise ConfigError(f"power.cgroup_dir must be a path, got {values['cgroup_dir']!r}.", hint="fix it.")
            values["cgroup_dir"] = Path(values["cgroup_dir"])
        return cls(**values)

    def for_emulation(
        self, compute_share: float, cgroup_dir: Path | None = None, root_pid: int | None = None
    ) -> "PowerConfig":
        """This config switched to the emulated-device model with the agent's [emulation] values."""
        return replace(self, source="emulated", compute_share=compute_share, cgroup_dir=cgroup_dir, root_pid=root_pid)


def available_sources(
    root: Path = Path("/"), *, nvml_lib: Any = None, pi5_runner: Callable[[list[str]], str] | None = None
) -> list[Availability]:
    """Every source's probe result, measured ones first, the model last. Never raises."""
    return [
        rapl.probe(root),
        nvml.probe(nvml_lib),
        jetson.probe(root),
        pi5.probe(root, pi5_runner),
        android.probe(root),
        model.probe(root),
    ]


def _open_named(
    name: str, config: PowerConfig, root: Path, nvml_lib: Any, pi5_runner: Callable[[list[str]], str] | None
) -> PowerSource:
    if name == rapl.NAME:
        return rapl.RaplPowerSource(root)
    if name == nvml.NAME:
        return nvml.NvmlPowerSource(nvml_lib)
    if name == jetson.NAME:
        return jetson.JetsonPowerSource(root)
    if name == pi5.NAME:
        return pi5.Pi5PowerSource(pi5_runner)
    if name == android.NAME:
        return android.AndroidBatteryPowerSource(root)
    if name == model.NAME:
        return model.UtilizationModelSource(config.idle_w, config.busy_w, cpu_model=model.cpu_model_name(root))
    raise ConfigError(f"power source {name!r} is unknown.", hint=f"use one of {', '.join(SOURCE_NAMES)}.")


def _try_open(name: str, config: PowerConfig, root: Path, nvml_lib: Any, runner: Any) -> PowerSource | None:
    try:
        return _open_named(name, config, root, nvml_lib, runner)
    except PowerSourceError as exc:
        log.warning("Power source %s probed available but failed to open: %s", name, exc)
        return None


def _open_auto(config: PowerConfig, root: Path, nvml_lib: Any, runner: Any) -> PowerSource:
    found = {a.name: a for a in available_sources(root, nvml_lib=nvml_lib, pi5_runner=runner)}
    host = [
        s
        for n in (rapl.NAME, nvml.NAME)
        if found[n].available
        for s in [_try_open(n, config, root, nvml_lib, runner)]
        if s
    ]
    if len(host) > 1:
        return CombinedSource(host)
    if host:
        return host[0]
    for name in (jetson.NAME, pi5.NAME, android.NAME):
        if not found[name].available:
            continue
        if name == android.NAME and android.is_plugged(root):
            log.warning("The phone is plugged in, so battery power is meaningless; using the CPU model. "
                        "Unplug it and restart the agent for measured power.")
            continue
        source = _try_open(name, config, root, nvml_lib, runner)
        if source is not None:
            return source
    log.info("No measured power source here; using the CPU utilization model")
    return _open_named(model.NAME, config, root, nvml_lib, runner)


def open_source(
    config: PowerConfig,
    root: Path = Path("/"),
    *,
    nvml_lib: Any = None,
    pi5_runner: Callable[[list[str]], str] | None = None,
) -> PowerSource:
    """Open the configured source (see the module docstring for ``auto``).

    A named source that is not available raises PowerSourceError saying why and which are.
    """
    if config.source == "emulated":
        assert config.idle_w is not None and config.busy_w is not None and config.compute_share is not None
        return EmulatedPowerSource(
            config.idle_w, config.busy_w, config.compute_share, config.cgroup_dir, config.root_pid
        )
    if config.source == "auto":
        return _open_auto(config, root, nvml_lib, pi5_runner)
    if config.source != model.NAME:
        probes = available_sources(root, nvml_lib=nvml_lib, pi5_runner=pi5_runner)
        wanted = next(a for a in probes if a.name == config.source)
        if not wanted.available:
            usable = ", ".join(a.name for a in probes if a.available)
            raise PowerSourceError(
                f"Power source {config.source!r} is not available here: {wanted.detail.rstrip('.')}.",
                hint=f"set power.source to \"auto\" or one of the available sources: {usable}.",
            )
    return _open_named(config.source, config, root, nvml_lib, pi5_runner)

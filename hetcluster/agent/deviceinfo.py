"""The static facts GetDeviceInfo reports, gathered once when the agent starts.

Everything is read from an injectable root (``/proc/cpuinfo``, ``/proc/device-tree/model``,
``/etc/nv_tegra_release``) so tests can describe a Raspberry Pi or a Jetson with a few files.
TensorFlow's version comes from package metadata: importing TensorFlow would cost seconds and
hundreds of MB in a daemon that never uses it itself.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
from dataclasses import MISSING, fields
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, TypeVar

import psutil

import hetcluster
from hetcluster.agent.config import AgentConfig
from hetcluster.agent.messages import AcceleratorInfo, DeviceInfo, PowerSourceStatus
from hetcluster.errors import HetclusterError

log = logging.getLogger(__name__)

T = TypeVar("T")

_CPU_MODEL_KEYS = ("model name", "Model", "Hardware", "Processor", "cpu model", "cpu")


def cpu_model(root: Path = Path("/")) -> str:
    """A human name for the CPU: x86 "model name", Raspberry Pi "Model", else the device tree."""
    fields: dict[str, str] = {}
    try:
        for line in (root / "proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and value.strip():
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        log.debug("no %s", root / "proc/cpuinfo")
    for key in _CPU_MODEL_KEYS:
        if key in fields:
            return fields[key]
    model = _device_tree_model(root)
    return model or platform.processor() or platform.machine()


def _device_tree_model(root: Path) -> str:
    try:
        return (root / "proc/device-tree/model").read_bytes().rstrip(b"\0").decode(errors="replace").strip()
    except OSError:
        return ""


def is_tegra(root: Path = Path("/")) -> bool:
    """Jetson boards (unified CPU/GPU memory) announce themselves in these two places."""
    if (root / "etc/nv_tegra_release").exists():
        return True
    try:
        return b"nvidia,tegra" in (root / "proc/device-tree/compatible").read_bytes()
    except OSError:
        return False


def tensorflow_version() -> str:
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-aarch64", "tensorflow-macos"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def resolve_device_kind(configured: str, accelerators: list[AcceleratorInfo], root: Path = Path("/")) -> str:
    """``auto``: discrete-gpu when NVML sees a GPU, unified on Jetson (Tegra), else cpu."""
    if configured != "auto":
        return configured
    if is_tegra(root):
        return "unified"
    return "discrete-gpu" if accelerators else "cpu"


def _accelerators() -> list[AcceleratorInfo]:
    from hetcluster.power import list_nvidia_accelerators

    return _probe("list NVIDIA accelerators", list_nvidia_accelerators, AcceleratorInfo)


def _power_sources() -> list[PowerSourceStatus]:
    from hetcluster.power import available_sources

    return _probe("probe power sources", available_sources, PowerSourceStatus)


def _probe(what: str, probe: Callable[[], list[Any]], kind: type[T]) -> list[T]:
    """Run a power-room probe and copy each result (dict or object) into our dataclass ``kind``;
    a failing probe is logged and yields nothing, so GetDeviceInfo always answers."""
    try:
        found = probe()
    except HetclusterError as error:
        log.warning("cannot %s: %s", what, error)
        return []
    result = []
    for item in found:
        values = {}
        for f in fields(kind):  # type: ignore[arg-type]
            value = item.get(f.name, MISSING) if isinstance(item, dict) else getattr(item, f.name, MISSING)
            if value is not MISSING:
                values[f.name] = value
        result.append(kind(**values))
    return result


def collect_device_info(
    config: AgentConfig, active_power_source: str, root: Path = Path("/"), probe_hardware: bool = True
) -> DeviceInfo:
    """Gather the device facts; ``probe_hardware=False`` skips NVML and the power-source probe."""
    accelerators = _accelerators() if probe_hardware else []
    return DeviceInfo(
        device_name=config.name,
        hostname=socket.gethostname(),
        platform=platform.platform(),
        architecture=platform.machine(),
        cpu_model=cpu_model(root),
        cpu_count=os.cpu_count() or 1,
        memory_bytes=int(psutil.virtual_memory().total),
        accelerators=tuple(accelerators),
        power_sources=tuple(_power_sources() if probe_hardware else []),
        active_power_source=active_power_source,
        agent_version=hetcluster.__version__,
        tensorflow_version=tensorflow_version(),
        device_kind=resolve_device_kind(config.device_kind, accelerators, root),
        memory_budget_bytes=config.memory_budget_bytes,
        compute_share=config.emulation.compute_share if config.emulation else 0.0,
        emulated=config.emulated,
    )

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
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

import hetcluster
from hetcluster.agent.config import AgentConfig
from hetcluster.agent.messages import AcceleratorInfo, DeviceInfo, PowerSourceStatus
from hetcluster.errors import HetclusterError

log = logging.getLogger(__name__)

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

    try:
        found = list_nvidia_accelerators()
    except HetclusterError as error:
        log.warning("cannot list NVIDIA accelerators: %s", error)
        return []
    return [
        AcceleratorInfo(
            vendor=str(_field(a, "vendor", "nvidia")),
            name=str(_field(a, "name", "")),
            index=int(_field(a, "index", 0)),
            uuid=str(_field(a, "uuid", "")),
            memory_bytes=int(_field(a, "memory_bytes", 0)),
        )
        for a in found
    ]


def _power_sources() -> list[PowerSourceStatus]:
    from hetcluster.power import available_sources

    try:
        found = available_sources()
    except HetclusterError as error:
        log.warning("cannot probe power sources: %s", error)
        return []
    return [
        PowerSourceStatus(
            name=str(_field(s, "name", "")),
            measured=bool(_field(s, "measured", False)),
            available=bool(_field(s, "available", False)),
            detail=str(_field(s, "detail", "")),
        )
        for s in found
    ]


def _field(item: Any, name: str, default: Any) -> Any:
    if isinstance(item, dict):
        return item.get(name, default)
    return getattr(item, name, default)


def collect_device_info(config: AgentConfig, active_power_source: str, root: Path = Path("/"), probe_hardware: bool = True) -> DeviceInfo:
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

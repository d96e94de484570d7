"""The inventory: which devices make up a fleet, where their agents listen, and how to reach them.

Every command that talks to a fleet takes ``--inventory FILE``; `hetcluster cluster up` writes one
for the emulated fleet and operators write one by hand for real devices (see docs/inventory.md).
This module is pure (tomllib + dataclasses): it parses and validates once at the boundary, so
later code never meets a half-valid device entry. Relative credential paths resolve against the
folder of the inventory file, so an inventory and its ``creds/`` folder can move together.
"""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hetcluster.agent.config import split_host_port
from hetcluster.errors import ConfigError
from hetcluster.fileio import write_text_atomic

log = logging.getLogger(__name__)

NETWORKS = ("loopback", "shaped", "real")

_TOP_KEYS = {"cluster", "devices"}
_CLUSTER_KEYS = {"name", "network", "idle_power_counts", "parameter_server_host", "tf_plane_isolation"}
TF_PLANE_ISOLATIONS = ("auto", "none")
_DEVICE_KEYS = {
    "name",
    "address",
    "token_file",
    "ca_file",
    "cert_file",
    "key_file",
    "server_name",
    "memory_budget_bytes",
    "idle_power_counts",
    "profile",
    "device_class",
}
_CREDENTIAL_KEYS = ("token_file", "ca_file", "cert_file", "key_file")


@dataclass(frozen=True)
class DeviceEntry:
    """One device of the fleet: its agent's address and the credentials to call it."""

    name: str
    address: str
    token_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    memory_budget_bytes: int | None = None
    idle_power_counts: bool | None = None
    profile: str | None = None
    device_class: str | None = None   # identical devices share it: pre-training measures one of
                                      # them alone, the planner groups them (docs/inventory.md)

    @property
    def host(self) -> str:
        return split_host_port(self.address)[0]

    def client(self, timeout_s: float = 10.0) -> Any:
        """An AgentClient for this device (imported lazily: grpc is not needed to read a file)."""
        from hetcluster.agent.client import AgentClient

        return AgentClient(
            self.address,
            token_file=self.token_file,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            server_name=self.server_name,
            timeout_s=timeout_s,
        )


@dataclass(frozen=True)
class Inventory:
    """A validated inventory file."""

    name: str
    network: str
    idle_power_counts: bool
    parameter_server_host: str
    devices: tuple[DeviceEntry, ...] = ()
    path: Path | None = None
    # "none": the coordinator host's parameter servers and chief run without a namespace of their
    # own (the operator's opt-out where the kernel allows none); "auto" everywhere else
    tf_plane_isolation: str = "auto"

    def device(self, name: str) -> DeviceEntry:
        for entry in self.devices:
            if entry.name == name:
                return entry
        known = ", ".join(d.name for d in self.devices) or "none"
        raise ConfigError(f"no device {name!r} in the inventory {self.path}.", hint=f"use one of: {known}.")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def idle_counts(self, device: DeviceEntry) -> bool:
        """Whether this device's idle power counts in a configuration it does not join."""
        return self.idle_power_counts if device.idle_power_counts is None else device.idle_power_counts


def load_inventory(path: Path | str, check_credentials: bool = True) -> Inventory:
    """Read and validate an inventory TOML; every error names the file (and the device).

    ``check_credentials=False``: credential files need not be readable now (a command that reads
    only a profile, such as ``plan --profile`` after ``cluster down`` removed the throwaway ones);
    an agent client made from such an entry fails then, naming the file."""
    inventory_path = Path(path).expanduser()
    try:
        text = inventory_path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"cannot read inventory {inventory_path}: {error.strerror}.",
            hint="pass an existing file with --inventory (`hetcluster cluster up --out FILE` writes one).",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            f"inventory {inventory_path} is not valid TOML: {error}.", hint="fix the syntax there."
        ) from None
    try:
        return inventory_from_mapping(data, base_dir=inventory_path.resolve().parent, path=inventory_path,
                                      check_credentials=check_credentials)
    except ConfigError as error:
        raise ConfigError(f"inventory {inventory_path}: {error.message}", hint=error.hint) from None


def inventory_from_mapping(data: Mapping[str, Any], base_dir: Path, path: Path | None = None,
                           check_credentials: bool = True) -> Inventory:
    """Validate a parsed inventory document; ``base_dir`` anchors relative credential paths."""
    _reject_unknown(data.keys(), _TOP_KEYS, "top-level key", "")
    cluster = data.get("cluster", {})
    if not isinstance(cluster, Mapping):
        raise ConfigError("[cluster] must be a table.", hint="write it as a [cluster] section.")
    _reject_unknown(cluster.keys(), _CLUSTER_KEYS, "key in [cluster]", "")
    name = _str(cluster, "name", "cluster", "fleet")
    network = _str(cluster, "network", "cluster", "real")
    if network not in NETWORKS:
        raise ConfigError(
            f"cluster.network {network!r} is not one of {', '.join(NETWORKS)}.", hint="pick one of those."
        )
    idle_counts = _bool(cluster, "idle_power_counts", "cluster", False)
    ps_host = _str(cluster, "parameter_server_host", "cluster", "127.0.0.1")
    if not ps_host or ps_host.count(":") == 1:
        raise ConfigError(
            f"cluster.parameter_server_host {ps_host!r} must be a host without a port.", hint="drop the :port."
        )
    isolation = _str(cluster, "tf_plane_isolation", "cluster", "auto")
    if isolation not in TF_PLANE_ISOLATIONS:
        raise ConfigError(f"cluster.tf_plane_isolation {isolation!r} is not one of {', '.join(TF_PLANE_ISOLATIONS)}.",
                          hint='use "auto"; "none" only where the coordinator host allows no namespace.')

    raw_devices = data.get("devices", [])
    if not isinstance(raw_devices, list) or not raw_devices:
        raise ConfigError(
            "the inventory lists no devices.", hint="add at least one [[devices]] table with name and address."
        )
    devices: list[DeviceEntry] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_devices):
        entry = _device(raw, index, base_dir, check_credentials)
        if entry.name in seen:
            raise ConfigError(
                f"device name {entry.name!r} appears twice.", hint="give every [[devices]] entry a unique name."
            )
        seen.add(entry.name)
        devices.append(entry)
    return Inventory(
        name=name,
        network=network,
        idle_power_counts=idle_counts,
        parameter_server_host=ps_host,
        devices=tuple(devices),
        path=path,
        tf_plane_isolation=isolation,
    )


def _device(raw: Any, index: int, base_dir: Path, check_credentials: bool = True) -> DeviceEntry:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"devices[{index}] is not a table.", hint="write each device as a [[devices]] table.")
    label = raw.get("name") if isinstance(raw.get("name"), str) else f"devices[{index}]"
    where = f"device {label!r}"
    _reject_unknown(raw.keys(), _DEVICE_KEYS, "key", f" in {where}")
    name = _str(raw, "name", where, "")
    if not name:
        raise ConfigError(f"devices[{index}] has no name.", hint='add name = "my-device".')
    address = _str(raw, "address", where, "")
    if not address:
        raise ConfigError(f"{where} has no address.", hint='add address = "host:port" where its agent listens.')
    try:
        _host, port = split_host_port(address, what=f"{where} address")
    except ConfigError as error:
        raise ConfigError(error.message, hint=error.hint) from None
    if port == 0:
        raise ConfigError(
            f"{where} address {address!r} has port 0.", hint="give the port the agent actually listens on."
        )

    files = {key: _credential(raw, key, where, base_dir, check_credentials) for key in _CREDENTIAL_KEYS}
    if (files["cert_file"] is None) != (files["key_file"] is None):
        raise ConfigError(f"{where} sets only one of cert_file/key_file.", hint="mTLS needs both, plus ca_file.")
    if files["cert_file"] is not None and files["ca_file"] is None:
        raise ConfigError(
            f"{where} has a client certificate but no ca_file.", hint="add ca_file (the CA that signed the agent)."
        )
    if files["token_file"] is None and files["ca_file"] is None:
        raise ConfigError(
            f"{where} has no credentials.",
            hint="set token_file and/or ca_file+cert_file+key_file (`hetcluster agent credentials` makes them).",
        )
    budget = raw.get("memory_budget_bytes")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ConfigError(
            f"{where} memory_budget_bytes must be a positive integer, got {budget!r}.",
            hint="give bytes, e.g. 4294967296.",
        )
    server_name = _str(raw, "server_name", where, "") or None
    profile = _str(raw, "profile", where, "") or None
    device_class = _str(raw, "device_class", where, "") or None
    idle = raw.get("idle_power_counts")
    if idle is not None and not isinstance(idle, bool):
        raise ConfigError(
            f"{where} idle_power_counts must be true or false, got {idle!r}.", hint="write true or false."
        )
    return DeviceEntry(
        name=name,
        address=address,
        server_name=server_name,
        memory_budget_bytes=budget,
        idle_power_counts=idle,
        profile=profile,
        device_class=device_class,
        **files,
    )


def _credential(raw: Mapping[str, Any], key: str, where: str, base_dir: Path, check: bool = True) -> Path | None:
    value = _str(raw, key, where, "")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = Path(os.path.normpath(base_dir / path))
    if not check:
        return path
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{where} {key} {str(path)!r} is unreadable ({error.strerror}).",
            hint="fix the path (relative paths start at the inventory's folder) or the file's permissions.",
        ) from None
    return path


def inventory_to_mapping(inventory: Inventory, relative_to: Path | None = None) -> dict[str, Any]:
    """The TOML document of an inventory; credential paths relative to ``relative_to`` when given."""

    def path_text(path: Path) -> str:
        if relative_to is None:
            return str(path)
        return os.path.relpath(path, relative_to)

    devices = []
    for device in inventory.devices:
        entry: dict[str, Any] = {"name": device.name, "address": device.address}
        for key in _CREDENTIAL_KEYS:
            value = getattr(device, key)
            if value is not None:
                entry[key] = path_text(value)
        for key in ("server_name", "memory_budget_bytes", "idle_power_counts", "profile", "device_class"):
            value = getattr(device, key)
            if value is not None:
                entry[key] = value
        devices.append(entry)
    return {
        "cluster": {
            "name": inventory.name,
            "network": inventory.network,
            "idle_power_counts": inventory.idle_power_counts,
            "parameter_server_host": inventory.parameter_server_host,
            **({"tf_plane_isolation": inventory.tf_plane_isolation} if inventory.tf_plane_isolation != "auto" else {}),
        },
        "devices": devices,
    }


def write_inventory(inventory: Inventory, path: Path | str) -> Path:
    """Write atomically (temp file + os.replace); credential paths become relative to the file."""
    import tomli_w

    target = Path(path).expanduser()
    document = inventory_to_mapping(inventory, relative_to=target.resolve().parent)
    write_text_atomic(target, tomli_w.dumps(document))
    log.info("wrote inventory %s (%d devices)", target, len(inventory.devices))
    return target


def _reject_unknown(keys: Any, allowed: set[str], what: str, where: str) -> None:
    unknown = sorted(set(keys) - allowed)
    if unknown:
        raise ConfigError(
            f"unknown {what}{where}: {', '.join(unknown)}.", hint=f"allowed: {', '.join(sorted(allowed))}."
        )


def _str(table: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}.", hint="quote the value.")
    return value.strip()


def _bool(table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}.", hint="write true or false.")
    return value


__all__ = [
    "DeviceEntry",
    "Inventory",
    "NETWORKS",
    "inventory_from_mapping",
    "inventory_to_mapping",
    "load_inventory",
    "write_inventory",
]

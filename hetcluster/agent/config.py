"""Typed agent settings, parsed once from ``agent.toml`` at the boundary.

The file format is shared: the emulation room writes these files for emulated devices and
operators write them for real ones, so the keys below are a stable contract. Unknown keys and
bad values raise ConfigError naming the key; relative paths resolve against the folder of the
config file. The ``[power]`` table is kept as a raw mapping and parsed by
``hetcluster.power.PowerConfig.from_mapping`` (that room owns its keys).

    [agent]
    name = "jetson-nano-1"          # required
    listen = "0.0.0.0:50051"        # port 0 allowed
    port_file = ""                  # once bound, the agent writes "host:port" here atomically
    device_kind = "auto"            # auto|cpu|unified|discrete-gpu
    memory_budget_bytes = 0         # 0 = no limit configured
    tf_host = ""                    # host of the task addresses it reports
    state_dir = ""                  # task logs; default a temp dir
    [auth]
    token_file = "token"            # either or both of token / TLS must be set
    cert_file = "server.crt"
    key_file = "server.key"
    client_ca_file = "ca.crt"       # mTLS: clients must present a cert signed by this CA
    [power]
    source = "auto"
    [tf_plane]
    isolation = "auto"              # auto: each TF server in a namespace of its own; "none": the operator's opt-out
    allow_open = false              # developer switch: let a coordinator ask for an open TF plane (tests, benchmarks)
    [emulation]
    compute_share = 0.25
    cgroup_dir = "/sys/fs/cgroup/..."     # the device's CPU accounting (the power model reads it)
    task_cgroup_procs = ["/sys/fs/cgroup/.../cgroup.procs"]  # each TF server joins these before it execs
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hetcluster.errors import ConfigError
from hetcluster.fileio import write_text_atomic

log = logging.getLogger(__name__)

DEVICE_KINDS = ("auto", "cpu", "unified", "discrete-gpu")

_AGENT_KEYS = {"name", "listen", "port_file", "device_kind", "memory_budget_bytes", "tf_host", "state_dir"}
_AUTH_KEYS = {"token_file", "cert_file", "key_file", "client_ca_file"}
_EMULATION_KEYS = {"compute_share", "cgroup_dir", "task_cgroup_procs"}
_TF_PLANE_KEYS = {"isolation", "allow_open"}
TF_PLANE_ISOLATIONS = ("auto", "none")
_TABLES = {"agent", "auth", "power", "emulation", "tf_plane"}


def split_host_port(address: str, *, what: str = "address", port_zero_hint: str = "") -> tuple[str, int]:
    """Split "host:port" or "[v6]:port"; raise ConfigError with the expected form otherwise.
    With ``port_zero_hint`` a port of 0 is refused too (an address a client must connect to)."""
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"{what} {address!r} is not host:port.", hint='write it as "[::1]:50051".')
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or ":" in host:
            raise ConfigError(f"{what} {address!r} is not host:port.", hint='write it as "10.0.0.5:50051".')
    if not valid_host(host):
        raise ConfigError(f"{what} {address!r} has an invalid host {host!r}.",
                          hint="use an IP address or a host name of letters, digits, '-' and '.'.")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{what} {address!r} has a non-numeric port.", hint="use a port in 0..65535.") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} {address!r} has port {port} out of range.", hint="use a port in 0..65535.")
    if port == 0 and port_zero_hint:
        raise ConfigError(f"{what} {address!r} has port 0.", hint=port_zero_hint)
    return host, port


_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def valid_host(host: str) -> bool:
    """An IP literal, or a host name whose dot-separated labels are letters, digits, '-' (not at
    an end) and '_' (seen in real host names), at most 253 characters."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    return 0 < len(host) <= 253 and all(_HOST_LABEL.match(label) for label in labels)


def join_host_port(host: str, port: int) -> str:
    """The inverse of split_host_port (brackets IPv6 literals)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class AuthConfig:
    """Credential files of the agent; None means not configured."""

    token_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @property
    def mtls(self) -> bool:
        return self.client_ca_file is not None


@dataclass(frozen=True)
class TfPlaneConfig:
    """How the agent guards the TF servers it starts (hetcluster.plane). ``isolation`` "auto"
    gives each a network namespace of its own and refuses tasks where the kernel allows none;
    "none" is the operator's explicit opt-out (the servers' ports are then reachable from the
    network). ``allow_open``: a developer switch that lets a coordinator ask for TF servers with
    no namespace and no TLS at all; never on by default."""

    isolation: str = "auto"
    allow_open: bool = False


@dataclass(frozen=True)
class EmulationConfig:
    """Set only for emulated devices: the CPU share the emulator grants this agent's tasks, the
    cgroup whose CPU time the power model reads, and the ``cgroup.procs`` files each TF server
    task joins before it execs (the tasks are the device's work and run inside its quota; the
    agent itself stays outside, see docs/emulation.md)."""

    compute_share: float = 0.0
    cgroup_dir: Path | None = None
    task_cgroup_procs: tuple[Path, ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    name: str
    listen: str = "0.0.0.0:50051"
    port_file: Path | None = None
    device_kind: str = "auto"
    memory_budget_bytes: int = 0
    tf_host: str = ""
    state_dir: Path | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    power: Mapping[str, Any] = field(default_factory=dict)
    emulation: EmulationConfig | None = None
    tf_plane: TfPlaneConfig = field(default_factory=TfPlaneConfig)
    source_path: Path | None = None

    @property
    def listen_host(self) -> str:
        return split_host_port(self.listen, what="agent.listen")[0]

    @property
    def listen_port(self) -> int:
        return split_host_port(self.listen, what="agent.listen")[1]

    @property
    def emulated(self) -> bool:
        return self.emulation is not None

    def task_host(self) -> str:
        """Host part of the addresses reported for tasks and reserved ports."""
        if self.tf_host:
            return self.tf_host
        host = self.listen_host
        if host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return host

    def power_config(self, root_pid: int | None = None) -> Any:
        """The parsed [power] table (hetcluster.power.PowerConfig). On an emulated device a
        source of "auto" or "emulated" becomes the emulated model over this agent's own process
        tree (``root_pid``, default this process) or its cgroup."""
        from hetcluster.power import PowerConfig

        table = dict(self.power)
        if self.emulation is None or table.get("source", "auto") not in ("auto", "emulated"):
            return PowerConfig.from_mapping(table)
        # parse as "auto" first: "emulated" alone is incomplete until [emulation] fills it in
        return PowerConfig.from_mapping({**table, "source": "auto"}).for_emulation(
            self.emulation.compute_share, self.emulation.cgroup_dir, root_pid=root_pid or os.getpid()
        )

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], base_dir: Path | None = None, source_path: Path | None = None
    ) -> "AgentConfig":
        """Validate a parsed TOML document; ``base_dir`` anchors relative paths."""
        base = base_dir or Path.cwd()
        _reject_unknown(data.keys(), _TABLES, "top-level table")
        agent = _table(data, "agent")
        _reject_unknown(agent.keys(), _AGENT_KEYS, "key in [agent]")
        name = agent.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("agent.name is missing or empty.", hint='set name = "my-device" in [agent].')
        listen = _string(agent, "listen", "agent", "0.0.0.0:50051")
        split_host_port(listen, what="agent.listen")
        device_kind = _string(agent, "device_kind", "agent", "auto")
        if device_kind not in DEVICE_KINDS:
            raise ConfigError(
                f"agent.device_kind {device_kind!r} is not one of {', '.join(DEVICE_KINDS)}.",
                hint="pick one of those kinds.",
            )
        budget = agent.get("memory_budget_bytes", 0)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ConfigError(
                f"agent.memory_budget_bytes must be a non-negative integer, got {budget!r}.",
                hint="give bytes, e.g. 4294967296 for 4 GiB, or 0 for no limit.",
            )
        tf_host = _string(agent, "tf_host", "agent", "")
        if tf_host and (":" in tf_host and not _is_ipv6(tf_host)):
            raise ConfigError(f"agent.tf_host {tf_host!r} must be a host without a port.", hint="drop the :port.")

        auth_table = _table(data, "auth")
        _reject_unknown(auth_table.keys(), _AUTH_KEYS, "key in [auth]")
        auth = AuthConfig(**{key: _path(auth_table, key, "auth", base) for key in sorted(_AUTH_KEYS)})
        if (auth.cert_file is None) != (auth.key_file is None):
            raise ConfigError("auth.cert_file and auth.key_file must be set together.", hint="set both or neither.")
        if auth.client_ca_file is not None and auth.cert_file is None:
            raise ConfigError(
                "auth.client_ca_file (mTLS) needs a server certificate.",
                hint="set auth.cert_file and auth.key_file too (hetcluster agent credentials makes them).",
            )
        if auth.token_file is None and auth.cert_file is None:
            raise ConfigError(
                "the agent has no credentials: [auth] sets neither token_file nor cert_file/key_file.",
                hint="run `hetcluster agent credentials --out DIR` and point [auth] at the files.",
            )

        plane_table = _table(data, "tf_plane")
        _reject_unknown(plane_table.keys(), _TF_PLANE_KEYS, "key in [tf_plane]")
        isolation = _string(plane_table, "isolation", "tf_plane", "auto")
        if isolation not in TF_PLANE_ISOLATIONS:
            raise ConfigError(f"tf_plane.isolation {isolation!r} is not one of {', '.join(TF_PLANE_ISOLATIONS)}.",
                              hint='use "auto"; "none" only where the kernel allows no namespace.')
        allow_open = plane_table.get("allow_open", False)
        if not isinstance(allow_open, bool):
            raise ConfigError(f"tf_plane.allow_open must be true or false, got {allow_open!r}.", hint="write false.")

        power = _table(data, "power")
        emulation = None
        if "emulation" in data:
            emu = _table(data, "emulation")
            _reject_unknown(emu.keys(), _EMULATION_KEYS, "key in [emulation]")
            share = emu.get("compute_share", 1.0)
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
                raise ConfigError(
                    f"emulation.compute_share must be a positive number of CPU cores, got {share!r}.",
                    hint="e.g. compute_share = 0.25 for a quarter of one core.",
                )
            procs = emu.get("task_cgroup_procs", [])
            if not isinstance(procs, list) or not all(isinstance(p, str) and p.strip() for p in procs):
                raise ConfigError(f"emulation.task_cgroup_procs must be a list of paths, got {procs!r}.",
                                  hint='e.g. task_cgroup_procs = ["/sys/fs/cgroup/hetcluster/demo/rpi4/cgroup.procs"].')
            emulation = EmulationConfig(
                compute_share=float(share),
                cgroup_dir=_path(emu, "cgroup_dir", "emulation", base),
                task_cgroup_procs=tuple(_resolve(p, base) for p in procs),
            )

        config = cls(
            name=name.strip(),
            listen=listen,
            port_file=_path(agent, "port_file", "agent", base),
            device_kind=device_kind,
            memory_budget_bytes=int(budget),
            tf_host=tf_host,
            state_dir=_path(agent, "state_dir", "agent", base),
            auth=auth,
            power=dict(power),
            emulation=emulation,
            tf_plane=TfPlaneConfig(isolation=isolation, allow_open=allow_open),
            source_path=source_path,
        )
        config.power_config()  # validates [power] with the power room's own rules
        return config


def load_config(path: Path | str) -> AgentConfig:
    """Read and validate an agent.toml file."""
    config_path = Path(path).expanduser()
    try:
        text = config_path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"cannot read agent config {config_path}: {error.strerror}.", hint="check the --config path."
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{config_path} is not valid TOML: {error}.", hint="fix the syntax at that line.") from None
    try:
        return AgentConfig.from_mapping(data, base_dir=config_path.resolve().parent, source_path=config_path)
    except ConfigError as error:
        raise ConfigError(f"{config_path}: {error.message}", hint=error.hint) from None


def write_config(document: Mapping[str, Any], path: Path | str) -> Path:
    """Validate a config document, then write it as TOML atomically (for tools that make configs)."""
    import tomli_w

    target = Path(path)
    AgentConfig.from_mapping(document, base_dir=target.resolve().parent)
    write_text_atomic(target, tomli_w.dumps(dict(document)))
    return target


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def _reject_unknown(keys: Any, allowed: set[str], what: str) -> None:
    unknown = sorted(set(keys) - allowed)
    if unknown:
        raise ConfigError(f"unknown {what}: {', '.join(unknown)}.", hint=f"allowed: {', '.join(sorted(allowed))}.")


def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"[{name}] must be a table.", hint=f"write it as a [{name}] section.")
    return value


def _string(table: Mapping[str, Any], key: str, section: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{section}.{key} must be a string, got {value!r}.", hint="quote the value.")
    return value.strip()


def _path(table: Mapping[str, Any], key: str, section: str, base: Path) -> Path | None:
    value = _string(table, key, section, "")
    return _resolve(value, base) if value else None


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)

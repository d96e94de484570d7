"""Start, inspect and stop an emulated fleet: one real agent process per catalog device.

`cluster_up` checks the fleet fits this machine, makes throwaway credentials, and for each device
makes its slowdown (a cgroup with a CPU quota and memory limit, else a duty-cycle supervisor) and,
with ``network="shaped"``, its namespace and shaped veth; then it starts the agent *inside* them
(a shell wrapper joins the cgroups and execs, so no process runs unslowed and the PID stays the
agent's), waits until every agent answers its health check and writes the inventory. Each step is
recorded in the state file first, so `cluster_down` — or `up`'s own clean-up on failure — stops
exactly the recorded processes and removes exactly the recorded cgroups and namespaces.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from hetcluster.agent.credentials import CredentialPaths
from hetcluster.emulation.catalog import DeviceProfile, check_fleet_fits
from hetcluster.emulation.cgroups import Cgroups, DeviceCgroup, detect_cgroups, remove_dirs
from hetcluster.emulation.dutycycle import DutyCycler
from hetcluster.emulation.slowdown import wrapper_command
from hetcluster.emulation.state import ClusterState, DeviceState, ProcessRecord, default_state_dir, load_state
from hetcluster.errors import EmulationError
from hetcluster.inventory import DeviceEntry, Inventory, load_inventory, write_inventory
from hetcluster.tfenv import tf_env

log = logging.getLogger(__name__)

SLOWDOWNS = ("auto", "cgroup", "dutycycle")
NETWORK_MODES = ("loopback", "shaped")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")


@dataclass
class DownReport:
    """What `cluster_down` did, and anything it could not remove."""

    stopped_pids: list[int] = field(default_factory=list)
    removed_cgroups: int = 0
    leftovers: list[str] = field(default_factory=list)


def cluster_up(
    profiles: list[DeviceProfile],
    inventory_path: Path,
    *,
    name: str = "emulated",
    network: str = "loopback",
    state_dir: Path | None = None,
    slowdown: str = "auto",
    health_timeout_s: float = 120.0,
    cgroup_root: Path = Path("/"),
    allow_open_plane: bool = False,
) -> Inventory:
    """Start the fleet and write its inventory; on any failure stop everything it started.
    ``allow_open_plane`` is the developer switch of the agents' [tf_plane] allow_open."""
    if not _NAME_RE.match(name):
        raise EmulationError(
            f"cluster name {name!r} is not 1-24 lower-case letters, digits or '-'.", hint="e.g. --name emulated."
        )
    if network not in NETWORK_MODES:
        raise EmulationError(
            f"--network {network!r} is not one of {', '.join(NETWORK_MODES)}.", hint="use loopback or shaped."
        )
    if slowdown not in SLOWDOWNS:
        raise EmulationError(f"--slowdown {slowdown!r} is not one of {', '.join(SLOWDOWNS)}.", hint="use auto.")
    if not profiles:
        raise EmulationError("no devices to start.", hint="pass --devices server,rpi4,...")
    for profile in profiles:
        if not _NAME_RE.match(profile.name):
            raise EmulationError(
                f"device name {profile.name!r} is not lower-case letters, digits or '-'.", hint="rename the profile."
            )
    check_fleet_fits(profiles)
    if network == "shaped":
        from hetcluster.emulation.netns import require_tools

        require_tools()

    state_dir = Path(state_dir or default_state_dir()).resolve()
    existing = load_state(state_dir)
    if existing is not None:
        raise EmulationError(
            f"a cluster is already up ({len(existing.devices)} devices, state in {existing.path}).",
            hint="run `hetcluster cluster down` first.",
        )
    cgroups = _choose_slowdown(slowdown, cgroup_root)
    state = ClusterState(
        name=name,
        network=network,
        slowdown=f"cgroup-{cgroups.version}" if cgroups else "dutycycle",
        state_dir=str(state_dir),
        inventory_path=str(Path(inventory_path).resolve()),
        credentials_dir=str(state_dir / "creds"),
        allow_open_plane=allow_open_plane,
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    state.save()
    try:
        return _start(state, profiles, cgroups, health_timeout_s, allow_open_plane)
    except BaseException:
        log.warning("cluster up failed; stopping what it started")
        report = _teardown(state)
        if report.leftovers:
            log.warning("could not remove: %s", "; ".join(report.leftovers))
        raise


def _choose_slowdown(slowdown: str, root: Path) -> Cgroups | None:
    if slowdown == "dutycycle":
        return None
    cgroups = detect_cgroups(root)
    if cgroups is None and slowdown == "cgroup":
        raise EmulationError(
            "no writable cgroup with a cpu controller here.", hint="run as root, or pass --slowdown auto."
        )
    return cgroups


def _start(state: ClusterState, profiles: list[DeviceProfile], cgroups: Cgroups | None, health_timeout_s: float,
           allow_open_plane: bool = False) -> Inventory:
    from hetcluster.agent.credentials import generate_credentials

    shaped = None
    if state.network == "shaped":
        from hetcluster.emulation.netns import create_network

        # create_network undoes its own half-made work; once it returns, the state records it.
        shaped = create_network(state.name, state.state_dir,
                                [(p.name, p.link_bandwidth_mbit_per_s, p.link_latency_ms) for p in profiles])
        state.shaped = shaped.to_state()
        state.save()
    hosts = ["127.0.0.1", "localhost", *(link.address for link in (shaped.links if shaped else []))]
    if shaped:
        hosts.append(shaped.host_address)
    creds = generate_credentials(Path(state.credentials_dir), hosts)

    launched = [_start_device(state, profile, cgroups, shaped, creds, allow_open_plane) for profile in profiles]
    _wait_healthy(launched, creds, health_timeout_s)
    inventory = Inventory(
        name=state.name,
        network=state.network,
        idle_power_counts=False,
        parameter_server_host=shaped.host_address if shaped else "127.0.0.1",
        devices=tuple(_entry(device, creds) for device in state.devices),
        path=Path(state.inventory_path),
    )
    write_inventory(inventory, state.inventory_path)
    state.save()
    log.info("cluster %s up: %d devices (%s, %s)", state.name, len(state.devices), state.slowdown, state.network)
    return inventory


def _start_device(state: ClusterState, profile: DeviceProfile, cgroups: Cgroups | None, shaped: Any,
                  creds: CredentialPaths, allow_open_plane: bool) -> tuple[DeviceState, subprocess.Popen]:
    """Make one device's slowdown (and find its namespace), start its agent inside them; each
    step recorded in the state first."""
    device_dir = Path(state.state_dir) / profile.name
    device_dir.mkdir(parents=True, exist_ok=True)
    device = DeviceState(
        name=profile.name,
        profile=profile.catalog_name,
        share=profile.compute_share,
        memory_budget_bytes=profile.memory_budget_bytes,
        config_path=str(device_dir / "agent.toml"),
        log_path=str(device_dir / "agent.log"),
    )
    state.devices.append(device)
    group: DeviceCgroup | None = None
    if cgroups is not None:
        group = cgroups.create(state.name, profile.name, profile.compute_share, profile.memory_budget_bytes)
        device.cgroup = group.to_state()
        state.save()
    host = shaped.link(profile.name).address if shaped else "127.0.0.1"
    prefix: list[str] = []
    sys_visible = True
    if shaped:
        from hetcluster.emulation.netns import exec_prefix

        prefix, sys_visible = exec_prefix(shaped.link(profile.name).netns)
    _write_agent_config(device, profile, host, creds, group if sys_visible else None, allow_open_plane)
    # an agent that cannot see /sys/fs/cgroup (`ip netns exec`) cannot put its TF servers into
    # the device's cgroups: it then runs inside them itself, and its servers inherit them
    process = _launch_agent(device, None if sys_visible else group, prefix)
    device.agent = ProcessRecord.of(process.pid)
    state.save()
    if group is None:
        supervisor = DutyCycler().start(process.pid, profile.compute_share, str(device_dir / "dutycycle.log"))
        if supervisor is not None:
            device.supervisor = ProcessRecord.of(supervisor.pid)
            state.save()
    return device, process


def _entry(device: DeviceState, creds: CredentialPaths) -> DeviceEntry:
    return DeviceEntry(
        name=device.name,
        address=device.address,
        token_file=creds.token,
        ca_file=creds.ca_cert,
        cert_file=creds.client_cert,
        key_file=creds.client_key,
        memory_budget_bytes=device.memory_budget_bytes,
        profile=device.profile,
        device_class=device.profile,   # one catalog profile: identical devices
    )


def cluster_add(profiles: list[DeviceProfile], state_dir: Path | None = None, *, health_timeout_s: float = 120.0,
                cgroup_root: Path = Path("/")) -> Inventory:
    """Start more devices in the running (loopback) fleet and add them to its inventory file, the
    entries already there kept as they are: a job that watches the inventory (`train --elastic`)
    sees them join. On any failure the devices it started are stopped again."""
    state = _running(state_dir)
    if state.network != "loopback":
        raise EmulationError(f"cluster add works on a loopback fleet; this one's network is {state.network}.",
                             hint="start the fleet with every device (`cluster up --devices ...`).")
    if not profiles:
        raise EmulationError("no devices to add.", hint="pass --devices rpi4,...")
    taken = {d.name for d in state.devices} | set(_inventory_names(state))
    profiles = [_unclaimed(profile, taken) for profile in profiles]
    for profile in profiles:
        if not _NAME_RE.match(profile.name):
            raise EmulationError(
                f"device name {profile.name!r} is not lower-case letters, digits or '-'.", hint="rename the profile."
            )
    check_fleet_fits([*(_PresentShare(d.name, d.share) for d in state.devices), *profiles])
    cgroups = None if state.slowdown == "dutycycle" else detect_cgroups(cgroup_root)
    creds = CredentialPaths.under(Path(state.credentials_dir))
    before = len(state.devices)
    try:
        launched = [_start_device(state, profile, cgroups, None, creds, state.allow_open_plane)
                    for profile in profiles]
        _wait_healthy(launched, creds, health_timeout_s)
        inventory = load_inventory(state.inventory_path)
        inventory = dataclasses.replace(
            inventory, devices=(*inventory.devices, *(_entry(d, creds) for d in state.devices[before:])))
        write_inventory(inventory, state.inventory_path)
        state.save()
    except BaseException:
        log.warning("cluster add failed; stopping the devices it started")
        _stop_devices(state, state.devices[before:], 10.0, DownReport())
        raise
    log.info("cluster %s: added %s", state.name, ", ".join(p.name for p in profiles))
    return inventory


def cluster_remove(names: list[str], state_dir: Path | None = None, grace_s: float = 10.0) -> DownReport:
    """Stop the named devices of the running fleet (their agents and TF servers, their cgroups)
    and take them out of its inventory file: a job that watches it (`train --elastic`) sees them
    leave."""
    state = _running(state_dir)
    known = {d.name: d for d in state.devices}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EmulationError(f"no emulated device {', '.join(map(repr, unknown))} in cluster {state.name!r}.",
                             hint=f"its devices are: {', '.join(known) or 'none'}.")
    if not names:
        raise EmulationError("no device to remove.", hint="pass --device NAME.")
    report = DownReport()
    _stop_devices(state, [known[n] for n in names], grace_s, report)
    inventory = load_inventory(state.inventory_path, check_credentials=False)
    if inventory.devices and any(d.name not in names for d in inventory.devices):
        write_inventory(dataclasses.replace(inventory, devices=tuple(d for d in inventory.devices
                                                                       if d.name not in names)),
                        state.inventory_path)
    log.info("cluster %s: removed %s", state.name, ", ".join(names))
    return report


def _unclaimed(profile: DeviceProfile, taken: set[str]) -> DeviceProfile:
    """``profile`` under a name the fleet has not used: a second server is server-2 (one device
    class with the first, as `up` numbers identical devices); the name is then taken."""
    name, number = profile.name, 1
    while name in taken:
        number += 1
        name = f"{profile.catalog_name}-{number}"
    taken.add(name)
    return profile if name == profile.name else dataclasses.replace(profile, name=name,
                                                                    profile_name=profile.catalog_name)


@dataclass(frozen=True)
class _PresentShare:
    """A running device's compute share, as check_fleet_fits reads a profile's."""

    name: str
    compute_share: float


def _running(state_dir: Path | None) -> ClusterState:
    directory = Path(state_dir or default_state_dir()).resolve()
    state = load_state(directory)
    if state is None:
        raise EmulationError(
            f"no emulated cluster is up (no state in {directory}).",
            hint="pass --state-dir if it was started elsewhere, or start one with `hetcluster cluster up`.",
        )
    return state


def _inventory_names(state: ClusterState) -> tuple[str, ...]:
    try:
        return load_inventory(state.inventory_path, check_credentials=False).names
    except Exception:  # noqa: BLE001 - an inventory edited into something unreadable: its names cannot clash
        return ()


def _write_agent_config(
    device: DeviceState,
    profile: DeviceProfile,
    host: str,
    creds: CredentialPaths,
    group: DeviceCgroup | None,
    allow_open_plane: bool = False,
) -> None:
    from hetcluster.agent.config import write_config

    device_dir = Path(device.config_path).parent
    emulation: dict[str, Any] = {"compute_share": profile.compute_share}
    if group is not None:
        emulation["cgroup_dir"] = str(group.accounting_dir)
        emulation["task_cgroup_procs"] = [str(path) for path in group.procs_files]
    write_config(
        {
            "agent": {
                "name": device.name,
                "listen": f"{host}:0",
                "port_file": str(device_dir / "agent.addr"),
                "device_kind": "cpu",
                "memory_budget_bytes": profile.memory_budget_bytes,
                "tf_host": host,
                "state_dir": str(device_dir / "tasks"),
            },
            "auth": {
                "token_file": str(creds.token),
                "cert_file": str(creds.server_cert),
                "key_file": str(creds.server_key),
                "client_ca_file": str(creds.ca_cert),
            },
            "power": {"source": "emulated", "idle_w": profile.idle_w, "busy_w": profile.busy_w},
            "emulation": emulation,
            **({"tf_plane": {"allow_open": True}} if allow_open_plane else {}),
        },
        device.config_path,
    )


def agent_command(config_path: str) -> list[str]:
    """How an emulated device's agent is run: the same `hetcluster agent serve` users run."""
    return [sys.executable, "-m", "hetcluster.cli.app", "agent", "serve", "--config", config_path]


def _launch_agent(device: DeviceState, joined: DeviceCgroup | None, prefix: list[str]) -> subprocess.Popen:
    """Start the agent (inside its namespace, if any), inside the cgroups ``joined`` only: an agent
    whose config names the device's cgroups stays outside them and puts each TF server it starts
    into them (``[emulation] task_cgroup_procs``), so the quota slows the device's training and not
    the agent's own gRPC and power sampling."""
    command = wrapper_command(agent_command(device.config_path), joined.procs_files if joined else (), prefix)
    env = tf_env(TF_CPP_MIN_LOG_LEVEL="2")   # the agent's TF warnings and errors go to its log
    try:
        with open(device.log_path, "ab") as log_file:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                       cwd=str(Path(device.config_path).parent), env=env, start_new_session=True)
    except OSError as error:
        raise EmulationError(
            f"cannot start the agent of {device.name!r}: {error}.", hint=f"see {device.log_path}."
        ) from None
    log.info("started agent %s as pid %d", device.name, process.pid)
    return process


def _wait_healthy(
    launched: list[tuple[DeviceState, subprocess.Popen]], creds: CredentialPaths, timeout_s: float
) -> None:
    """Poll each agent's port file, then its health check, until all answer or time runs out."""
    from hetcluster.agent.client import AgentClient

    deadline = time.monotonic() + timeout_s
    pending = dict((device.name, (device, process)) for device, process in launched)
    while pending:
        for name, (device, process) in list(pending.items()):
            if process.poll() is not None:
                raise EmulationError(
                    f"the agent of {name!r} exited with status {process.returncode} while starting: "
                    f"{_tail(device.log_path)}",
                    hint=f"see {device.log_path}.",
                )
            port_file = Path(device.config_path).parent / "agent.addr"
            if not device.address:
                try:
                    device.address = port_file.read_text().strip()
                except OSError:
                    continue
            client = AgentClient(device.address, token_file=creds.token, ca_file=creds.ca_cert,
                                 cert_file=creds.client_cert, key_file=creds.client_key, timeout_s=2.0)
            try:
                if client.health():
                    log.info("agent %s healthy at %s", name, device.address)
                    del pending[name]
            finally:
                client.close()
        if pending and time.monotonic() > deadline:
            raise EmulationError(
                f"agents {', '.join(sorted(pending))} did not answer health checks within {timeout_s:g} s.",
                hint="raise --timeout-s on a busy machine, or see the agent logs in the state directory.",
            )
        if pending:
            time.sleep(0.2)


def _tail(path: str, lines: int = 3) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def cluster_down(state_dir: Path | None = None, grace_s: float = 10.0) -> DownReport:
    """Stop the recorded processes, remove the recorded cgroups and namespaces, delete the state."""
    return _teardown(_running(state_dir), grace_s)


def _stop_devices(state: ClusterState, devices: list[DeviceState], grace_s: float, report: DownReport) -> list:
    """Stop these devices' processes, remove their cgroups and folders, and drop them from the
    state (saved); returns their cgroups (whose parents the caller may remove)."""
    # Supervisors first: each resumes its (stopped) tree on exit, so SIGTERM can then be handled.
    supervisors = [d.supervisor.process() for d in devices if d.supervisor]
    _stop([p for p in supervisors if p is not None], grace_s, report)
    groups = [DeviceCgroup.from_state(d.cgroup) for d in devices if d.cgroup]
    victims: dict[int, psutil.Process] = {}
    for device in devices:
        agent = device.agent.process() if device.agent else None
        if agent is not None:
            for process in [agent, *_children(agent)]:
                victims[process.pid] = process
    for group in groups:  # anything left in our cgroups is ours too (an orphaned TF server)
        for pid in group.pids():
            try:
                victims.setdefault(pid, psutil.Process(pid))
            except psutil.Error:
                continue
    _stop(list(victims.values()), grace_s, report)
    for group in groups:
        left = group.remove()
        report.removed_cgroups += len(group.dirs) - len(left)
        report.leftovers.extend(f"cgroup {p}" for p in left)
    state_dir = Path(state.state_dir)
    for device in devices:
        shutil.rmtree(state_dir / device.name, ignore_errors=True)
    gone = {id(d) for d in devices}
    state.devices = [d for d in state.devices if id(d) not in gone]
    if state.path.exists():
        state.save()
    return groups


def _teardown(state: ClusterState, grace_s: float = 10.0) -> DownReport:
    report = DownReport()
    groups = _stop_devices(state, list(state.devices), grace_s, report)
    # Parents (hetcluster/<cluster>) were made by the first device; now that all are gone, retry them.
    remove_dirs([p for group in groups for p in group.parents])
    if state.shaped:
        from hetcluster.emulation.netns import ShapedNetwork, remove_network

        report.leftovers.extend(remove_network(ShapedNetwork.from_state(state.shaped)))
    shutil.rmtree(state.credentials_dir, ignore_errors=True)
    state.path.unlink(missing_ok=True)
    try:
        Path(state.state_dir).rmdir()
    except OSError:
        pass  # not empty: it holds the user's other files
    log.info("cluster %s down: stopped %d processes", state.name, len(report.stopped_pids))
    return report


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def _stop(processes: list[psutil.Process], grace_s: float, report: DownReport) -> None:
    """SIGTERM (and SIGCONT, in case a duty cycle left it stopped), then SIGKILL after grace_s."""
    for process in processes:
        for signum in (signal.SIGTERM, signal.SIGCONT):
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass
    _gone, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            log.warning("process %d ignored SIGTERM for %g s; killing it", process.pid, grace_s)
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    report.stopped_pids.extend(p.pid for p in processes)


__all__ = ["DownReport", "NETWORK_MODES", "SLOWDOWNS", "agent_command", "cluster_add", "cluster_down",
           "cluster_remove", "cluster_up"]

"""`hetcluster cluster up|status|down` end to end: real agents, and nothing left behind."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetcluster.emulation.state import ProcessRecord, load_state
from hetcluster.inventory import load_inventory


def cli(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _up(tmp_path: Path, devices: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    state_dir, inventory = tmp_path / "state", tmp_path / "cluster.toml"
    result = cli("cluster", "up", "--devices", devices, "--out", str(inventory), "--state-dir", str(state_dir),
                 "--name", f"t{os.getpid()}-{abs(hash(str(tmp_path))) % 100000}", *extra)
    return result, state_dir, inventory


def _recorded(state_dir: Path):
    state = load_state(state_dir)
    assert state is not None
    records = [r for d in state.devices for r in (d.agent, d.supervisor) if r is not None]
    cgroup_dirs = [Path(p) for d in state.devices if d.cgroup for p in
                   {d.cgroup["cpu_dir"], d.cgroup["accounting_dir"], d.cgroup["memory_dir"]} if p]
    netns = [link["netns"] for link in (state.shaped or {}).get("links", [])]
    return state, records, cgroup_dirs, netns


def _assert_nothing_left(records, cgroup_dirs, netns, state_dir: Path) -> None:
    assert all(r.process() is None for r in records), [r.pid for r in records if r.process()]
    assert not any(d.exists() for d in cgroup_dirs)
    if netns:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(name in listed for name in netns), listed
    assert load_state(state_dir) is None


def _down_and_check(state_dir: Path, records, cgroup_dirs, netns) -> None:
    down = cli("cluster", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    _assert_nothing_left(records, cgroup_dirs, netns, state_dir)
    again = cli("cluster", "down", "--state-dir", str(state_dir))
    assert again.returncode != 0
    assert "no emulated cluster is up" in again.stderr and "Traceback" not in again.stderr


@pytest.mark.slow
def test_up_status_down_on_loopback(tmp_path):
    result, state_dir, inventory_path = _up(tmp_path, "server,rpi4,phone")
    assert result.returncode == 0, result.stderr
    state, records, cgroup_dirs, netns = _recorded(state_dir)
    try:
        inventory = load_inventory(inventory_path)
        assert inventory.names == ("server", "rpi4", "phone") and inventory.network == "loopback"
        assert all(d.address.startswith("127.0.0.1:") for d in inventory.devices)
        assert all(d.token_file and d.ca_file and d.cert_file and d.key_file for d in inventory.devices)
        assert len({r.pid for r in records}) >= 3 and all(r.process() is not None for r in records)
        if state.slowdown.startswith("cgroup"):
            agent_pid = state.devices[1].agent.pid
            procs = Path(state.devices[1].cgroup["cpu_dir"]) / "cgroup.procs"
            # the agent stays outside the quota (its gRPC and power sampling are not the device's work)
            assert str(agent_pid) not in procs.read_text().split()

        status = cli("cluster", "status", "--inventory", str(inventory_path), "--format", "json")
        assert status.returncode == 0, status.stderr
        rows = {row["name"]: row for row in json.loads(status.stdout)["devices"]}
        assert all(row["healthy"] for row in rows.values())
        assert {row["power_source"] for row in rows.values()} == {"model"}
        assert rows["rpi4"]["compute_share"] == pytest.approx(0.15)
        assert rows["server"]["memory_budget_bytes"] == 8 * 2**30
        assert 2.7 <= rows["rpi4"]["power_w"] <= 6.4  # between the Pi's idle and busy watts

        # The agent's TF server joins the device's cgroups, and `down` stops it too.
        server = inventory.device("server")
        with server.client(timeout_s=30.0) as agent:
            address = agent.reserve_port()
            task = agent.start_task("worker", 0, {"worker": [address]})
            records.append(ProcessRecord.of(task.pid))
            if state.slowdown.startswith("cgroup"):
                procs = Path(state.devices[0].cgroup["cpu_dir"]) / "cgroup.procs"
                deadline = time.monotonic() + 10.0  # its wrapper shell joins, then execs the server
                while str(task.pid) not in procs.read_text().split() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert str(task.pid) in procs.read_text().split()
                memory_dir = Path(state.devices[0].cgroup["memory_dir"] or "/nonexistent")
                if memory_dir.exists():
                    assert int((memory_dir / "memory.limit_in_bytes").read_text()) == 8 * 2**30

        twice, _, _ = _up(tmp_path, "rpi4")
        assert twice.returncode != 0
        assert "a cluster is already up (3 devices" in twice.stderr and "cluster down" in twice.stderr
        assert "Traceback" not in twice.stderr

        # A dead device shows as down, and status exits non-zero.
        state.devices[2].agent.process().kill()
        status = cli("cluster", "status", "--state-dir", str(state_dir), "--format", "json")
        assert status.returncode == 1
        rows = {row["name"]: row for row in json.loads(status.stdout)["devices"]}
        assert rows["phone"]["healthy"] is False and rows["server"]["healthy"] is True
    finally:
        _down_and_check(state_dir, records, cgroup_dirs, netns)


@pytest.mark.slow
def test_up_down_with_duty_cycling(tmp_path):
    # rpi4*2: two identical devices, numbered, one device class in the inventory
    result, state_dir, inventory_path = _up(tmp_path, "rpi4*2,phone", "--slowdown", "dutycycle")
    assert result.returncode == 0, result.stderr
    state, records, cgroup_dirs, netns = _recorded(state_dir)
    try:
        inventory = load_inventory(inventory_path)
        assert [(d.name, d.profile, d.device_class) for d in inventory.devices] == [
            ("rpi4-1", "rpi4", "rpi4"), ("rpi4-2", "rpi4", "rpi4"), ("phone", "phone", "phone")]
        assert [d.share for d in state.devices] == [0.15, 0.15, 0.2]
        assert state.slowdown == "dutycycle" and not cgroup_dirs
        supervisors = [d.supervisor for d in state.devices]
        assert all(s is not None and s.process() is not None for s in supervisors)
        cmdline = " ".join(supervisors[0].process().cmdline())
        assert f"--pid {state.devices[0].agent.pid}" in cmdline and "--duty 0.15" in cmdline
    finally:
        _down_and_check(state_dir, records, cgroup_dirs, netns)


def _fast_catalog(tmp_path: Path) -> Path:
    """A quicker device than the catalog's, so its TF server starts in seconds."""
    catalog = tmp_path / "fast.toml"
    catalog.write_text("[profiles.fast]\ncompute_share = 0.6\nmemory_budget_bytes = 2147483648\nidle_w = 1.0\n"
                       "busy_w = 2.0\nlink_bandwidth_mbit_per_s = 100\nlink_latency_ms = 1.0\n")
    return catalog


def _running_worker(agent, records) -> tuple[object, str]:
    """(task, address) of a TF worker the agent started and reports running (its process recorded)."""
    address = agent.reserve_port()
    task = agent.start_task("worker", 0, {"worker": [address]})
    records.append(ProcessRecord.of(task.pid))
    deadline = time.monotonic() + 90
    while agent.task_status(task.task_id)[0].state == "starting" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert agent.task_status(task.task_id)[0].state == "running"
    return task, address


@pytest.mark.slow
@pytest.mark.root
def test_up_status_down_shaped(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("shaped networking needs root")
    result, state_dir, inventory_path = _up(
        tmp_path, "fast,phone", "--network", "shaped", "--catalog", str(_fast_catalog(tmp_path))
    )
    assert result.returncode == 0, result.stderr
    state, records, cgroup_dirs, netns = _recorded(state_dir)
    try:
        inventory = load_inventory(inventory_path)
        assert inventory.network == "shaped"
        hosts = [d.host for d in inventory.devices]
        assert all(h.startswith("10.213.") for h in hosts) and len(set(hosts)) == 2
        assert inventory.parameter_server_host == state.shaped["host_address"]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(name in listed for name in netns)
        status = cli("cluster", "status", "--inventory", str(inventory_path), "--format", "json")
        assert status.returncode == 0, status.stderr  # reached through the veths from the host namespace

        # A TF server started by the agent listens on the namespace address, reachable from the host.
        with inventory.device("fast").client(timeout_s=60.0) as agent:
            _, address = _running_worker(agent, records)
            assert address.startswith(inventory.device("fast").host + ":")
            host, port = address.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        _down_and_check(state_dir, records, cgroup_dirs, netns)


@pytest.mark.slow
@pytest.mark.root
def test_shaped_without_nsenter_runs_the_agent_inside_its_cgroups(tmp_path, monkeypatch):
    """Where nsenter is missing the agent starts through `ip netns exec`, which hides
    /sys/fs/cgroup from it: the cluster then starts the agent inside the device's cgroups (its TF
    servers inherit them) instead of telling it to move its servers in."""
    import shutil

    from hetcluster.emulation import netns as netns_module
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_up

    if os.geteuid() != 0:
        pytest.skip("shaped networking needs root")
    which = shutil.which
    monkeypatch.setattr(
        netns_module.shutil, "which", lambda name, *a, **k: None if name == "nsenter" else which(name, *a, **k)
    )
    assert netns_module.exec_prefix("x")[0][:3] == ["ip", "netns", "exec"]
    state_dir = tmp_path / "state"
    inventory = cluster_up(
        load_catalog(_fast_catalog(tmp_path)).select(["fast"]),
        tmp_path / "cluster.toml",
        network="shaped",
        state_dir=state_dir,
        name=f"t{os.getpid() % 100000}-nons",
    )
    state, records, cgroup_dirs, netns = _recorded(state_dir)
    try:
        if not cgroup_dirs:
            pytest.skip("no writable cgroups here: the devices are duty-cycled")
        device = state.devices[0]

        def members() -> set[int]:   # the processes in the device's cpu and accounting cgroups
            return {int(pid) for d in {device.cgroup["cpu_dir"], device.cgroup["accounting_dir"]}
                    for pid in (Path(d) / "cgroup.procs").read_text().split()}

        assert device.agent.pid in members()
        assert "task_cgroup_procs" not in Path(device.config_path).read_text()   # it cannot see them
        with inventory.device("fast").client(timeout_s=60.0) as agent:
            task, address = _running_worker(agent, records)
            assert task.pid in members()          # the server inherited the device's cgroups
            host, port = address.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        _down_and_check(state_dir, records, cgroup_dirs, netns)


@pytest.mark.slow
def test_add_and_remove_devices_of_a_running_fleet_keep_its_inventory_in_step(tmp_path):
    """`cluster add` starts agents beside the running ones (a second rpi4 is rpi4-2, of rpi4's class)
    and appends them to the inventory, keeping an entry written there by hand; `cluster remove`
    stops exactly the device named and takes it out of the inventory and the state."""
    import tomllib

    import tomli_w

    result, state_dir, inventory_path = _up(tmp_path, "rpi4")
    assert result.returncode == 0, result.stderr
    data = tomllib.loads(inventory_path.read_text())
    data["devices"].append(dict(data["devices"][0], name="by-hand", address="127.0.0.1:9"))
    inventory_path.write_text(tomli_w.dumps(data))
    try:
        added = cli("cluster", "add", "--devices", "rpi4,phone", "--state-dir", str(state_dir))
        assert added.returncode == 0, added.stderr
        inventory = load_inventory(inventory_path)
        assert inventory.names == ("rpi4", "by-hand", "rpi4-2", "phone")
        assert inventory.device("rpi4-2").device_class == "rpi4"
        status = cli("cluster", "status", "--inventory", str(inventory_path), "--format", "json")
        healthy = {row["name"]: row["healthy"] for row in json.loads(status.stdout)["devices"]}
        assert healthy == {"rpi4": True, "by-hand": False, "rpi4-2": True, "phone": True}
        state, records, cgroup_dirs, netns = _recorded(state_dir)
        gone = next(d for d in state.devices if d.name == "rpi4-2")
        removed = cli("cluster", "remove", "--device", "rpi4-2", "--state-dir", str(state_dir))
        assert removed.returncode == 0, removed.stderr
        assert gone.agent.process() is None
        assert not any(Path(p).exists() for p in (gone.cgroup or {}).values() if isinstance(p, str) and p)
        assert load_inventory(inventory_path).names == ("rpi4", "by-hand", "phone")
        assert [d.name for d in load_state(state_dir).devices] == ["rpi4", "phone"]
        unknown = cli("cluster", "remove", "--device", "by-hand", "--state-dir", str(state_dir))
        assert unknown.returncode != 0 and "no emulated device 'by-hand'" in unknown.stderr
        assert "Traceback" not in unknown.stderr
    finally:
        state, records, cgroup_dirs, netns = _recorded(state_dir)
        _down_and_check(state_dir, records, cgroup_dirs, netns)


def test_add_to_a_shaped_fleet_is_refused_in_one_line(tmp_path):
    from hetcluster.emulation.cluster import cluster_add
    from hetcluster.emulation.state import ClusterState
    from hetcluster.errors import EmulationError

    ClusterState("s", "shaped", "dutycycle", str(tmp_path), str(tmp_path / "c.toml"), str(tmp_path / "creds")).save()
    with pytest.raises(EmulationError, match="works on a loopback fleet"):
        cluster_add([], tmp_path)


def test_oversubscribed_fleet_is_refused_before_starting_anything(tmp_path):
    result, state_dir, inventory = _up(tmp_path, "server,jetson-xavier,jetson-tx2,jetson-nano,rpi4")
    assert result.returncode != 0
    cores = len(os.sched_getaffinity(0))
    if cores < 2.1:
        assert "oversubscribed by" in result.stderr
    assert "Traceback" not in result.stderr
    assert not state_dir.exists() and not inventory.exists()


def test_unknown_device_and_bad_network_are_one_line_errors(tmp_path):
    result, _, _ = _up(tmp_path, "server,toaster")
    assert result.returncode != 0 and "no device profile 'toaster'" in result.stderr
    assert "Traceback" not in result.stderr
    result, state_dir, _ = _up(tmp_path, "rpi4", "--network", "wifi")
    assert result.returncode != 0 and "--network 'wifi'" in result.stderr
    assert not state_dir.exists()


def test_shaped_without_root_suggests_loopback(monkeypatch):
    from hetcluster.emulation import netns
    from hetcluster.errors import EmulationError

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError, match="--network loopback"):
        netns.require_tools()


def test_status_and_down_with_nothing_up(tmp_path):
    result = cli("cluster", "status", "--state-dir", str(tmp_path / "none"))
    assert result.returncode != 0 and "no emulated cluster is up" in result.stderr
    result = cli("cluster", "down", "--state-dir", str(tmp_path / "none"))
    assert result.returncode != 0 and "no emulated cluster is up" in result.stderr
    assert "Traceback" not in result.stderr

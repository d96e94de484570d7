"""wait_until_serving: servers started side by side are waited for together, and one that dies
fails the wait with its own log while the others are stopped (no TensorFlow: the children here
are small Python programs that behave like a TF server's start)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetcluster.errors import AgentError, TaskError
from hetcluster.training import servers as servers_module
from hetcluster.training.servers import (
    LocalServer,
    address_reachable,
    free_port,
    free_ports,
    port_bindable,
    wait_until_serving,
)

LISTEN = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("tf_server: serving at", sys.argv[1], flush=True)
time.sleep(60)
"""


def _server(job: str, index: int, code: str, *args: str) -> LocalServer:
    tmpdir = tempfile.TemporaryDirectory(prefix="hetcluster-test-")
    log_path = Path(tmpdir.name) / "server.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=log_file, stderr=subprocess.STDOUT)
    return LocalServer(job, index, f"127.0.0.1:{args[0] if args else 1}", process, log_path, tmpdir)


class _LowestFreePortSocket:
    """A stand-in socket whose kernel hands out the lowest port not bound now: a released port
    comes straight back, as a real kernel may (CI once gave two tasks one address that way)."""

    bound: set[int] = set()

    def __init__(self, *args):
        self.port = None

    def bind(self, address):
        self.port = min(set(range(40000, 40100)) - self.bound)
        self.bound.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.bound.discard(self.port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_free_ports_are_distinct_even_when_the_kernel_reuses_a_released_port(monkeypatch):
    monkeypatch.setattr(
        servers_module, "socket", SimpleNamespace(socket=_LowestFreePortSocket, AF_INET=2, SOCK_STREAM=1)
    )
    assert free_ports(4, "127.0.0.1") == [40000, 40001, 40002, 40003]
    assert servers_module.free_addresses(2, "127.0.0.1") == ["127.0.0.1:40000", "127.0.0.1:40001"]
    assert not _LowestFreePortSocket.bound  # every socket released


def test_free_ports_are_free_and_distinct():
    ports = free_ports(20, "127.0.0.1")
    assert len(set(ports)) == 20
    assert not any(address_reachable(f"127.0.0.1:{port}") for port in ports)


def test_start_local_servers_starts_every_server_before_waiting(monkeypatch):
    # each stand-in takes 2.5 s to serve, like a TF import: side by side about 2.5 s, one after another 5+
    ports = iter(free_ports(2, "127.0.0.1"))
    monkeypatch.setattr(servers_module, "spawn_local_server",
                        lambda spec, job, index, plane=None: _server(job, index, LISTEN, str(next(ports)), "2.5"))
    t0 = time.monotonic()
    started = servers_module.start_local_servers({}, [("ps", 0), ("worker", 0)], timeout_s=30)
    try:
        assert time.monotonic() - t0 < 4.0
        assert [(s.job, s.index) for s in started] == [("ps", 0), ("worker", 0)] and all(s.serving() for s in started)
    finally:
        for server in started:
            server.stop()


def test_a_server_that_dies_fails_the_wait_with_its_log_and_stops_the_others():
    alive = _server("ps", 0, LISTEN, str(free_port("127.0.0.1")), "30")
    dead = _server("worker", 1, "import sys; print('port already in use'); sys.exit(1)")
    with pytest.raises(TaskError, match=r"worker:1 .* did not start: port already in use"):
        wait_until_serving([alive, dead], timeout_s=30)
    assert not alive.alive()


def test_a_late_server_fails_the_wait_after_the_timeout():
    late = _server("ps", 0, LISTEN, str(free_port("127.0.0.1")), "30")
    t0 = time.monotonic()
    with pytest.raises(TaskError, match="ps:0"):
        wait_until_serving([late], timeout_s=0.5)
    assert time.monotonic() - t0 < 5 and not late.alive()


def test_a_server_log_tail_is_one_line_and_never_fails():
    server = _server("ps", 0, "print('first line'); print('x' * 50); print('last  line')")
    server.process.wait(timeout=30)
    try:
        assert server.log_tail(20) == "xxxxxxxx last line"  # the last 20 characters, newlines included
        server.log_path.unlink()
        assert server.log_tail(20).startswith("(its log is unreadable: ")
    finally:
        server.stop()


class _Agent:
    """A stand-in agent client: the worker task's status, or the agent gone."""

    def __init__(self, task: object = None) -> None:
        self.task = task

    def task_status(self, task_id: str) -> list:
        if self.task is None:
            raise AgentError("agent at 127.0.0.1:1 unreachable")
        return [self.task]


def test_a_failed_run_names_the_servers_that_ended_with_their_logs():
    from hetcluster.agent.messages import TaskInfo
    from hetcluster.training.launch import LaunchedCluster
    from hetcluster.training.spec import ClusterAddresses

    ps = _server("ps", 0, "import sys; print('Check failed: out of memory'); sys.exit(6)")
    ps.process.wait(timeout=30)
    running = TaskInfo("w0", "worker", 0, "127.0.0.1:2", 11, "running")
    failed = TaskInfo("w1", "worker", 1, "127.0.0.1:3", 12, "failed", message="...\nSegmentation fault")
    addresses = ClusterAddresses(
        workers={"a": "127.0.0.1:2", "b": "127.0.0.1:3", "c": "127.0.0.1:4"}, ps=[ps.address], chief=""
    )
    launched = LaunchedCluster(addresses, {"a": "w0", "b": "w1", "c": "w2"},
                               [ps], {"a": _Agent(running), "b": _Agent(failed), "c": _Agent()})
    try:
        assert launched.ended_servers() == [
            "ps:0 exited with code 6: Check failed: out of memory",
            "worker on b failed: ... Segmentation fault",
            "worker on c: its agent did not answer (agent at 127.0.0.1:1 unreachable)"]
    finally:
        ps.stop()


def test_a_tensorflow_error_keeps_each_root_error_on_one_line():
    from hetcluster.training.engine import op_error_summary

    message = ("2 root error(s) found.\n  (0) UNAVAILABLE: Socket closed\n\t [[{{node Add}}]]\n"
               "  (1) CANCELLED: Function was cancelled before it was started\n0 successful operations.\n")
    assert op_error_summary(message) == ("2 root error(s) found.; (0) UNAVAILABLE: Socket closed; "
                                         "(1) CANCELLED: Function was cancelled before it was started")
    assert op_error_summary("Deadline exceeded\n") == "Deadline exceeded"
    assert op_error_summary("") == "unknown TensorFlow error"


def test_run_on_devices_asks_which_servers_ended_before_it_stops_them(monkeypatch):
    from hetcluster.errors import TrainingError
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training import coordinator, launch
    from hetcluster.training.spec import TrainSpec

    events = []

    class Launched:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append("stopped")

        def ended_servers(self):
            events.append("asked")
            return ["ps:0 exited with code -9: "]

    class Device:
        def client(self, timeout_s):
            raise AgentError("no agent here")  # the power meter leaves it out

    class Inventory:
        devices: list = []
        parameter_server_host = "127.0.0.1"
        tf_plane_isolation = "auto"

        def device(self, name):
            return Device()

    def train_on(*args, **kwargs):
        raise TrainingError("Training failed: 2 root error(s) found.", hint="resume.")

    monkeypatch.setattr(launch, "launch_cluster", lambda *args, **kwargs: Launched())
    monkeypatch.setattr(coordinator, "train_on", train_on)
    spec = TrainSpec(model=ModelSpec("small_cnn", (16, 16, 3), 4, 8), total_steps=10)
    with pytest.raises(
        TrainingError, match=r"2 root error\(s\) found\. Servers that ended: ps:0 exited with code -9"
    ) as caught:
        coordinator.run_on_devices(Inventory(), ["a"], spec)
    assert caught.value.hint == "resume." and events == ["asked", "stopped"]


def test_a_port_another_socket_listens_on_is_not_bindable_and_the_chief_moves_off_it() -> None:
    import socket

    from hetcluster.training.engine import with_bindable_chief
    from hetcluster.training.spec import ClusterAddresses

    *workers, ps, chief = [f"localhost:{p}" for p in free_ports(3)]
    cluster = ClusterAddresses(workers={"a": workers[0]}, ps=[ps], chief=chief)
    port = int(chief.rpartition(":")[2])
    assert port_bindable(port) and with_bindable_chief(cluster) is cluster
    with socket.socket() as squatter:
        squatter.bind(("localhost", port))
        squatter.listen()
        assert not port_bindable(port)
        moved = with_bindable_chief(cluster)
    assert moved.chief.startswith("localhost:") and moved.chief != chief
    assert (moved.workers, moved.ps) == (cluster.workers, cluster.ps)

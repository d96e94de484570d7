"""StartTask / GetTaskStatus / StopTask with a real tf.distribute.Server child process."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from test_agent_server import RampSource, make_config  # tests/ is on sys.path (rootdir conftest)

from hetcluster.agent.client import AgentClient
from hetcluster.agent.server import AgentServer
from hetcluster.agent.tasks import TaskSupervisor
from hetcluster.errors import AgentError
from hetcluster.plane.isolation import listening_ports
from hetcluster.plane.localspec import local_ports

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    from hetcluster.agent.credentials import generate_credentials

    return generate_credentials(tmp_path_factory.mktemp("creds"))


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def mtls_client(server, creds) -> AgentClient:
    return AgentClient(server.address, token_file=creds.token, ca_file=creds.ca_cert, cert_file=creds.client_cert,
                       key_file=creds.client_key)


def test_start_status_stop_a_real_tf_server(tmp_path, creds):
    server = AgentServer(make_config(tmp_path, creds, token=True, tls=True, mtls=True), RampSource(),
                         probe_hardware=False).start()
    try:
        with mtls_client(server, creds) as client:
            worker = client.reserve_port()
            ps = client.reserve_port()
            spec = {"worker": [worker], "ps": [ps]}
            started = client.start_task("worker", 0, spec, task_id="w0")
            assert started.task_id == "w0" and started.address == worker and started.pid > 0
            assert started.state in ("starting", "running")
            running = wait_for(
                lambda: next((t for t in client.task_status("w0") if t.state == "running"), None), 60, "RUNNING"
            )
            # the server runs in a network namespace of its own, listening at its local port there;
            # on the agent's host only the mTLS forwarding port (its address in the spec) listens
            assert os.readlink(f"/proc/{running.pid}/ns/net") != os.readlink("/proc/self/ns/net")
            local_port = local_ports(spec)[worker]
            assert local_port in listening_ports(running.pid)
            assert local_port not in listening_ports(os.getpid())
            assert int(worker.rsplit(":", 1)[1]) in listening_ports(os.getpid())
            assert running.rss_bytes > 10_000_000 and running.cpu_time_s > 0 and running.uptime_s > 0
            assert psutil.pid_exists(running.pid)
            assert [t.task_id for t in client.task_status()] == ["w0"]
            # the server imported TensorFlow without Keras (and the pandas Keras brings): tf_server._without_keras
            mapped = {m.path for m in psutil.Process(running.pid).memory_maps()}
            assert any("_pywrap_tensorflow_internal" in path for path in mapped)
            assert not any("pandas/_libs" in path for path in mapped)

            stopped = client.stop_task("w0", grace_s=5)
            assert stopped.state == "stopped" and stopped.exit_code is not None
            assert not psutil.pid_exists(running.pid) or psutil.Process(running.pid).status() == psutil.STATUS_ZOMBIE
            assert not live_group_members(running.pid)  # nothing left in its process group
    finally:
        server.stop()


def test_a_task_that_fails_reports_its_stderr_tail(tmp_path):
    supervisor = TaskSupervisor(tmp_path)
    # handlers.py only lets "grpc" through; the supervisor itself passes any protocol to TF,
    # which refuses an unknown one, so the child exits non-zero with the reason in its log
    task = supervisor.start("worker", 0, {"worker": ["127.0.0.1:2222"]}, task_id="bad", protocol="no-such-protocol")
    info = wait_for(
        lambda: next((t for t in supervisor.status("bad") if not t.alive), None), 60, "the bad task to exit"
    )
    assert info.state == "failed" and info.exit_code not in (None, 0)
    assert "no-such-protocol" in info.message  # the tail of its log
    assert task.pid == info.pid


def test_an_emulated_devices_task_joins_its_cgroups_before_it_runs(tmp_path):
    # cluster up gives an emulated device's agent its cgroup.procs files; plain files stand in
    # for them here: the wrapper shell writes its PID into each, then execs the server (same PID)
    procs = [tmp_path / "cpu.procs", tmp_path / "memory.procs"]
    supervisor = TaskSupervisor(tmp_path / "tasks", cgroup_procs=procs)
    task = supervisor.start("worker", 0, {"worker": ["127.0.0.1:2222"]}, task_id="joined", protocol="no-such-protocol")
    info = wait_for(lambda: next((t for t in supervisor.status("joined") if not t.alive), None), 60, "the task to exit")
    assert [p.read_text().split() for p in procs] == [[str(task.pid)], [str(task.pid)]]
    assert "no-such-protocol" in info.message  # it went on to run the server itself

    # a join that fails stops the task before the server runs, and says which file
    blocked = TaskSupervisor(tmp_path / "tasks2", cgroup_procs=[tmp_path / "missing" / "cgroup.procs"])
    blocked.start("worker", 0, {"worker": ["127.0.0.1:2223"]}, task_id="blocked")
    info = wait_for(lambda: next((t for t in blocked.status("blocked") if not t.alive), None), 30, "the task to fail")
    assert info.state == "failed" and "missing/cgroup.procs" in info.message


def test_an_agent_without_mutual_tls_refuses_tf_tasks_in_one_line(tmp_path, creds):
    server = AgentServer(
        make_config(tmp_path, creds, token=True, tls=False), RampSource(), probe_hardware=False
    ).start()
    try:
        with AgentClient(server.address, token_file=creds.token) as client:
            address = client.reserve_port()
            with pytest.raises(
                AgentError, match="FAILED_PRECONDITION: this agent has no mutual-TLS credentials"
            ) as caught:
                client.start_task("worker", 0, {"worker": [address]}, task_id="w0")
            assert "\n" not in str(caught.value)
            assert client.task_status() == []
    finally:
        server.stop()


def test_stopping_the_agent_stops_its_tasks(tmp_path, creds):
    server = AgentServer(make_config(tmp_path, creds, token=True, tls=True, mtls=True), RampSource(),
                         probe_hardware=False).start()
    with mtls_client(server, creds) as client:
        address = client.reserve_port()
        pid = client.start_task("ps", 0, {"ps": [address]}, task_id="ps0").pid
        wait_for(lambda: client.task_status("ps0")[0].state == "running", 60, "RUNNING")
    server.stop()
    wait_for(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 15, "task gone"
    )


def live_group_members(pgid: int) -> list[int]:
    """Processes (not zombies) still in process group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found

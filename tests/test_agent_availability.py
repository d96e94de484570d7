"""The agent stays available under abuse: busy or abandoned streams, port grabs, reservation
floods, malformed addresses, and task leases that lapse. No TensorFlow: a stand-in server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_agent_server import RampSource, creds, make_config  # noqa: F401 (creds is a fixture)

from hetcluster.agent.client import AgentClient
from hetcluster.agent.config import AgentConfig
from hetcluster.agent.ports import MAX_PER_CALLER
from hetcluster.agent.server import AgentServer
from hetcluster.agent.tasks import TaskSupervisor
from hetcluster.errors import AgentError
from hetcluster.proto.v1 import agent_pb2, agent_pb2_grpc


@pytest.fixture
def agent(tmp_path, creds):  # noqa: F811
    server = AgentServer(make_config(tmp_path, creds, token=True, tls=True, mtls=True), RampSource(),
                         probe_hardware=False).start()
    yield server
    server.stop()


def client_of(server, creds, **kwargs) -> AgentClient:  # noqa: F811
    return AgentClient(server.address, token_file=creds.token, ca_file=creds.ca_cert, cert_file=creds.client_cert,
                       key_file=creds.client_key, **kwargs)


def test_every_health_check_answers_under_200_concurrent_streams(agent, creds):  # noqa: F811
    clients = [client_of(agent, creds) for _ in range(4)]  # 50 streams per connection
    streams = [clients[i % 4].stream_power(rate_hz=10) for i in range(200)]
    outcomes: list[str] = []

    def drain(stream) -> None:
        try:
            next(iter(stream))
            outcomes.append("streaming")
        except AgentError as error:
            outcomes.append(error.message)
        except StopIteration:
            outcomes.append("ended")

    readers = [threading.Thread(target=drain, args=(s,), daemon=True) for s in streams]
    for reader in readers:
        reader.start()
    answers: list[bool] = []
    checkers = [threading.Thread(target=lambda: answers.append(client_of(agent, creds, timeout_s=5).health()))
                for _ in range(50)]
    for checker in checkers:
        checker.start()
    for checker in checkers:
        checker.join(30)
    assert answers == [True] * 50
    for reader in readers:
        reader.join(30)
    allowed = agent.state.streams.per_caller  # every stream here comes from one host
    assert outcomes.count("streaming") == allowed
    refused = [o for o in outcomes if o != "streaming"]
    assert len(refused) == 200 - allowed and all("RESOURCE_EXHAUSTED" in o for o in refused)
    for stream in streams:
        stream.cancel()
    for client in clients:
        client.close()


ABANDON = textwrap.dedent("""
    import sys, time
    from hetcluster.agent.client import AgentClient
    address, token, ca, cert, key = sys.argv[1:6]
    client = AgentClient(address, token_file=token, ca_file=ca, cert_file=cert, key_file=key)
    streams = [client.stream_power(rate_hz=float(sys.argv[6])) for _ in range(32)]
    opened = 0
    for stream in streams:
        try:
            next(iter(stream))
            opened += 1
        except Exception as error:
            pass
    print(opened, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("rate_hz", [0.001, 0.1])
def test_streams_abandoned_by_their_client_free_their_slots(agent, creds, rate_hz):  # noqa: F811
    args = [
        agent.address,
        str(creds.token),
        str(creds.ca_cert),
        str(creds.client_cert),
        str(creds.client_key),
        str(rate_hz),
    ]
    abandoner = subprocess.Popen([sys.executable, "-c", ABANDON, *args], stdout=subprocess.PIPE, text=True)
    opened = int(abandoner.stdout.readline())
    # below the minimum rate a stream is refused; at it, a caller holds at most its share
    assert opened == (0 if rate_hz < 0.1 else agent.state.streams.per_caller)
    abandoner.send_signal(signal.SIGKILL)
    abandoner.wait()
    with client_of(agent, creds, timeout_s=5) as client:
        deadline = time.monotonic() + 10
        while agent.state.streams._held:  # the calls end as the connection drops, not at the next sample
            assert time.monotonic() < deadline, "abandoned streams still hold their slots"
            time.sleep(0.1)
        assert client.health() and client.device_info().device_name == "test-dev"
        assert client.reserve_port() and client.task_status() == []
        assert len(list(client.stream_power(rate_hz=20, max_samples=3))) == 3


def test_a_second_agent_cannot_take_a_running_agents_port(tmp_path, creds):  # noqa: F811
    first = AgentServer(make_config(tmp_path, creds, token=True, tls=False), RampSource(), probe_hardware=False).start()
    try:
        document = {"agent": {"name": "second", "listen": first.address}, "auth": {"token_file": str(creds.token)}}
        config = tmp_path / "second.toml"
        config.write_text(
            f'[agent]\nname = "second"\nlisten = "{first.address}"\n[auth]\ntoken_file = "{creds.token}"\n'
            '[power]\nsource = "model"\nidle_w = 1.0\nbusy_w = 2.0\n'
        )
        with pytest.raises(AgentError, match="cannot listen on"):
            AgentServer(AgentConfig.from_mapping(document, tmp_path), RampSource(), probe_hardware=False)
        second = subprocess.run([sys.executable, "-m", "hetcluster.cli.app", "agent", "serve", "--config", str(config)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        errors = [line for line in second.stderr.splitlines() if "error" in line.lower()]  # not its INFO log lines
        assert len(errors) == 1 and errors[0].startswith("error: cannot listen on") and "Traceback" not in second.stderr
        with AgentClient(first.address, token_file=creds.token) as client:
            assert client.device_info().device_name == "test-dev"  # the first one still answers every call
    finally:
        first.stop()


def test_reservations_are_capped_per_caller(agent, creds):  # noqa: F811
    with client_of(agent, creds) as client:
        held = [client.reserve_port(ttl_s=60) for _ in range(MAX_PER_CALLER)]
        assert len(set(held)) == MAX_PER_CALLER
        with pytest.raises(AgentError, match="RESOURCE_EXHAUSTED"):
            client.reserve_port()
        assert client.health() and client.task_status() == []


@pytest.mark.parametrize("spec, field", [
    ({"worker": ["bad host!:2222"]}, "invalid host"),
    ({"worker": ["127.0.0.1:2222"], "Worker!": ["127.0.0.1:2223"]}, "job name"),
    ({"worker": ["127.0.0.1:2222"], "x" * 65: ["127.0.0.1:2223"]}, "job name"),
])
def test_malformed_cluster_specs_are_invalid_arguments(agent, creds, spec, field):  # noqa: F811
    with client_of(agent, creds) as client:
        with pytest.raises(AgentError, match=f"INVALID_ARGUMENT: .*{field}"):
            client.start_task("worker", 0, spec)
        assert client.task_status() == []


def test_renewing_unknown_tasks_says_they_are_gone(agent, creds):  # noqa: F811
    with client_of(agent, creds) as client:
        assert client.renew_task_leases(["nope", "neither"], lease_s=5) == ["nope", "neither"]
    channel = grpc.secure_channel(agent.address, grpc.ssl_channel_credentials(
        creds.ca_cert.read_bytes(), creds.client_key.read_bytes(), creds.client_cert.read_bytes()))
    stub = agent_pb2_grpc.AgentStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.RenewTaskLeases(agent_pb2.RenewTaskLeasesRequest(task_ids=["x"], lease_s=float("nan")),
                             metadata=(("authorization", f"Bearer {creds.token.read_text().strip()}"),))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status == 1
    channel.close()


@pytest.fixture
def sleeper(tmp_path):
    """A stand-in for Python that runs no TF server: it sleeps (in its own process group)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\nexec sleep 600\n")
    path.chmod(0o755)
    return str(path)


def test_a_task_whose_lease_lapses_is_stopped_and_renewal_keeps_one_alive(tmp_path, sleeper):
    supervisor = TaskSupervisor(tmp_path, python=sleeper)
    try:
        lapsing = supervisor.start("worker", 0, {"worker": ["127.0.0.1:1"]}, task_id="lapsing", lease_s=1.0)
        renewed = supervisor.start("worker", 0, {"worker": ["127.0.0.1:2"]}, task_id="renewed", lease_s=1.0)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert supervisor.renew(["renewed"], 1.0) == []
            time.sleep(0.3)
        states = {t.task_id: t.state for t in supervisor.status()}
        assert states == {"lapsing": "stopped", "renewed": "running" if states["renewed"] == "running" else "starting"}
        assert not _alive(lapsing.pid) and _alive(renewed.pid)
        assert supervisor.renew(["lapsing", "renewed"]) == ["lapsing"]
        time.sleep(2.0)  # no renewal for longer than the lease
        assert not _alive(renewed.pid) and supervisor.status("renewed")[0].state == "stopped"
    finally:
        supervisor.stop_all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    import psutil

    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE

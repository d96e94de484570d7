"""`hetcluster agent ...` as a user runs it: a real agent process from a temp config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_agent_tasks import live_group_members  # tests/ is on sys.path (rootdir conftest)

from hetcluster.agent.client import AgentClient
from hetcluster.errors import AgentError


def cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True, timeout=timeout_s
    )


def wait_for_file(path: Path, process: subprocess.Popen, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if process.poll() is not None:
            raise AssertionError(f"agent exited early: {process.stdout.read() if process.stdout else ''}")
        time.sleep(0.1)
    raise AssertionError(f"{path} not written in {timeout_s} s")


@pytest.fixture(params=[False])
def agent_process(tmp_path, request):
    """`agent serve` with a token and TLS; with mutual TLS where the test sets the param True."""
    import socket

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(10)
    result = cli("agent", "credentials", "--out", str(tmp_path / "creds"), "--host", "127.0.0.1")
    assert result.returncode == 0, result.stderr
    creds = tmp_path / "creds"
    assert {p.name for p in creds.iterdir()} == {
        "ca.crt",
        "ca.key",
        "server.crt",
        "server.key",
        "client.crt",
        "client.key",
        "token",
    }
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in creds.iterdir())
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nname = "cli-dev"\nlisten = "127.0.0.1:0"\nport_file = "run/addr"\nstate_dir = "state"\n'
        '[auth]\ntoken_file = "creds/token"\ncert_file = "creds/server.crt"\nkey_file = "creds/server.key"\n'
        + ('client_ca_file = "creds/ca.crt"\n' if request.param else '')
        + '[power]\nsource = "model"\nidle_w = 2.0\nbusy_w = 8.0\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "hetcluster.cli.app", "agent", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")},
    )
    address = wait_for_file(tmp_path / "run" / "addr", process)
    assert notify.recv(4096).startswith(b"READY=1\nSTATUS=serving cli-dev on 127.0.0.1:")
    process.notify_socket = notify  # type: ignore[attr-defined]
    yield process, address, creds
    notify.close()
    if process.poll() is None:
        process.kill()
        process.wait(10)


def test_serve_answers_rejects_and_exits_cleanly_on_sigterm(agent_process, tmp_path):
    process, address, creds = agent_process
    with AgentClient(address, ca_file=creds / "ca.crt") as anonymous:
        assert anonymous.health()
        with pytest.raises(AgentError, match="UNAUTHENTICATED"):
            anonymous.device_info()
    with AgentClient(address, token_file=creds / "token", ca_file=creds / "ca.crt") as client:
        info = client.device_info()
        assert info.device_name == "cli-dev" and info.active_power_source == "model"
        assert any(s.name == "model" and s.available for s in info.power_sources)
        samples = list(client.stream_power(rate_hz=20, max_samples=10))
        assert len(samples) == 10 and {s.source for s in samples} == {"model"}
        assert all(2.0 <= s.power_w <= 8.0 and not s.measured for s in samples)

    info = cli(
        "agent",
        "info",
        "--address",
        address,
        "--token-file",
        str(creds / "token"),
        "--ca-file",
        str(creds / "ca.crt"),
        "--format",
        "json",
    )
    assert info.returncode == 0, info.stderr
    document = json.loads(info.stdout)
    assert document["healthy"] and document["device"]["device_name"] == "cli-dev"
    assert document["power_sample"]["source"] == "model"

    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "addr").exists()
    assert process.notify_socket.recv(4096).startswith(b"STOPPING=1")


def test_cli_errors_are_one_line(tmp_path):
    missing = cli("agent", "serve", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "cannot read agent config" in missing.stderr
    unreachable = cli("agent", "info", "--address", "127.0.0.1:1", "--timeout-s", "2")
    assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr
    assert "is the agent running" in unreachable.stderr
    bad_format = cli("agent", "info", "--address", "127.0.0.1:1", "--format", "xml")
    assert bad_format.returncode != 0 and "--format" in bad_format.stderr


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.parametrize("agent_process", [True], indirect=True)  # TF tasks need mutual TLS
def test_sigterm_stops_tasks_and_a_killed_agent_leaves_no_orphan(agent_process):
    process, address, creds = agent_process
    with AgentClient(address, token_file=creds / "token", ca_file=creds / "ca.crt", cert_file=creds / "client.crt",
                     key_file=creds / "client.key") as client:
        pid = client.start_task("worker", 0, {"worker": [client.reserve_port()]}, task_id="w").pid
        deadline = time.monotonic() + 60
        while client.task_status("w")[0].state != "running":
            assert time.monotonic() < deadline, "task never RUNNING"
            time.sleep(0.2)
    assert psutil.Process(pid).ppid() == process.pid
    # SIGKILL: the agent cannot clean up, the task notices its parent is gone and exits
    process.kill()
    process.wait(10)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "orphaned TF server still running"
        time.sleep(0.2)
    assert not live_group_members(pid)


"""wait_until_serving: servers started side by side are waited for together, and one that dies
fails the wait with its own log while the others are stopped (no TensorFlow: the children here
are small Python programs that behave like a TF server's start)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hetcluster.errors import TaskError
from hetcluster.training import servers as servers_module
from hetcluster.training.servers import LocalServer, free_port, wait_until_serving

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


def test_start_local_servers_starts_every_server_before_waiting(monkeypatch):
    # each stand-in takes 2.5 s to serve, like a TF import: side by side about 2.5 s, one after another 5+
    ports = iter([free_port("127.0.0.1"), free_port("127.0.0.1")])
    monkeypatch.setattr(servers_module, "spawn_local_server",
                        lambda spec, job, index: _server(job, index, LISTEN, str(next(ports)), "2.5"))
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

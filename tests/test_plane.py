"""The training plane without TensorFlow: namespaces, mutual-TLS forwarding, probes, watches.

Stand-in TF processes (tests/plane_child.py) enter the plane and echo on their local port. Two
PlaneHosts play two hosts: A runs task X behind its mTLS listener, B runs Y, whose namespace
reaches X at X's local port. The test reaches into Y's namespace with a socket Y made there.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
import time
from pathlib import Path

import pytest

from hetcluster.agent.credentials import generate_credentials
from hetcluster.plane import tls
from hetcluster.plane.host import PlaneHost
from hetcluster.plane.isolation import isolation_problem, listening_ports
from hetcluster.plane.localspec import local_ports, local_spec

CHILD = [sys.executable, str(Path(__file__).with_name("plane_child.py"))]
X_PORT, Y_PORT = 21001, 21002

needs_netns = pytest.mark.skipif(isolation_problem() is not None, reason="no network namespaces here")


def test_local_ports_are_one_per_task_the_same_for_every_task_and_kept_by_a_subset():
    spec = {"worker": ["10.0.0.2:4000", "10.0.0.3:4000"], "ps": ["10.0.0.1:5000"], "chief": ["10.0.0.1:5001"]}
    ports = local_ports(spec)
    assert ports == {"10.0.0.1:5001": 21000, "10.0.0.1:5000": 21001, "10.0.0.2:4000": 21002, "10.0.0.3:4000": 21003}
    assert local_ports(dict(reversed(list(spec.items())))) == ports  # whatever order the spec comes in
    subset = {"worker": ["10.0.0.3:4000"], "ps": ["10.0.0.1:5000"], "chief": ["10.0.0.1:5001"]}
    assert local_spec(subset, ports) == {"worker": ["127.0.0.1:21003"], "ps": ["127.0.0.1:21001"],
                                         "chief": ["127.0.0.1:21000"]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet's credentials, and another CA's (a stranger's)."""
    base = tmp_path_factory.mktemp("plane")
    return generate_credentials(base / "fleet"), generate_credentials(base / "stranger")


def plane_host(name, creds, **kwargs) -> PlaneHost:
    server = tls.server_context(creds.server_cert, creds.server_key, [creds.ca_cert])
    client = tls.client_context(creds.client_cert, creds.client_key, [creds.ca_cert])
    return PlaneHost(name, server_ssl=server, client_ssl=lambda _address: client, **kwargs)


def public_socket() -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def wait_serving(child, timeout_s: float = 20.0) -> None:
    line = child.process.stdout.readline()
    assert line.strip() == b"serving", line


def echo_through(sock: socket.socket, address: tuple[str, int], payload: bytes) -> bytes:
    sock.settimeout(10)
    sock.connect(address)
    with sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    return got


@pytest.fixture
def two_hosts(fleet):
    creds, _stranger = fleet
    a, b = plane_host("a", creds), plane_host("b", creds)
    sock, x_address = public_socket()
    x_task = a.add_task(x_address, "worker:0", X_PORT, sock)
    x = a.spawn("x", [*CHILD, str(X_PORT)], {}, task=x_task, stdout=-1)
    y_task = b.add_task("127.0.0.1:1", "worker:1", Y_PORT)
    y = b.spawn("y", [*CHILD, str(Y_PORT)], b.routes({"worker": [x_address, "127.0.0.1:1"]}, "127.0.0.1:1",
                                                     {x_address: X_PORT, "127.0.0.1:1": Y_PORT}),
                task=y_task, watch=True, stdout=-1)
    wait_serving(x)
    wait_serving(y)
    yield a, b, x, y, x_address
    for host, child in ((a, x), (b, y)):
        child.process.kill()
        child.process.wait()
        host.release(child)
        host.close()


@needs_netns
def test_a_child_lives_alone_in_its_namespace_and_its_parent_reaches_in(two_hosts):
    _a, _b, x, _y, x_address = two_hosts
    assert os.readlink(f"/proc/{x.process.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert X_PORT in listening_ports(x.process.pid) and X_PORT not in listening_ports(os.getpid())
    # a socket X made in its namespace reaches its server; on this host nothing answers at that port
    assert echo_through(x.link.socket(), ("127.0.0.1", X_PORT), b"inside") == b"inside"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", X_PORT), timeout=2).close()


@needs_netns
def test_traffic_between_hosts_travels_over_mutual_tls_both_ways(two_hosts):
    a, b, x, y, x_address = two_hosts
    payload = os.urandom(3 << 20)
    # from inside Y's namespace, X's local port leads to X on the other host
    assert echo_through(y.link.socket(), ("127.0.0.1", X_PORT), payload) == payload
    assert b.probe(x_address, "x") and a.probe(x_address, "x")


@needs_netns
def test_a_stranger_gets_no_byte_of_the_task(two_hosts, fleet):
    _a, _b, _x, _y, x_address = two_hosts
    _creds, stranger = fleet
    host, port = x_address.split(":")
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"C" * 64

    def attempt(context: ssl.SSLContext | None) -> bytes:
        """What comes back within 3 s for a connect header and an HTTP/2 preface."""
        raw = socket.create_connection((host, int(port)), timeout=3)
        got = b""
        try:
            conn = context.wrap_socket(raw) if context else raw
            conn.sendall(b"C" + preface)
            while chunk := conn.recv(4096):
                got += chunk
        except (OSError, ssl.SSLError):
            pass
        finally:
            raw.close()
        return got

    plain = attempt(None)  # a bare TF client: not even a TLS handshake
    assert preface not in plain and b"+" not in plain
    no_cert = ssl.create_default_context()
    no_cert.check_hostname, no_cert.verify_mode = False, ssl.CERT_NONE
    assert attempt(no_cert) == b""
    other_ca = tls.client_context(stranger.client_cert, stranger.client_key, [stranger.ca_cert])
    other_ca.verify_mode = ssl.CERT_NONE
    assert attempt(other_ca) == b""
    # a member of the fleet gets through (the same attempt, the fleet's credentials)
    member = tls.client_context(_creds.client_cert, _creds.client_key, [_creds.ca_cert])
    assert attempt(member).startswith(b"+" + preface[:10])


@needs_netns
def test_a_watched_route_refuses_connections_while_its_task_is_down(two_hosts):
    a, _b, x, y, x_address = two_hosts
    assert echo_through(y.link.socket(), ("127.0.0.1", X_PORT), b"up") == b"up"
    x.process.kill()
    x.process.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            y.link.socket().connect(("127.0.0.1", X_PORT))
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "the watched route still accepts connections to a dead task"
        time.sleep(0.2)
    assert not a.probe(x_address, "x")


@needs_netns
def test_a_child_exits_when_its_parent_closes_the_control_socket(fleet):
    host = PlaneHost("solo")
    child = host.spawn("solo", [*CHILD, str(X_PORT)], {}, stdout=-1)
    wait_serving(child)
    child.link.close()
    assert child.process.wait(10) == 3
    host.release(child)
    host.close()

"""sd_notify against a real AF_UNIX datagram socket, path and abstract names."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from hetcluster.agent.notify import Notifier


def receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(("\0" + address[1:]) if address.startswith("@") else address)
    sock.settimeout(5)
    return sock


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_status_stopping_reach_the_socket(tmp_path, abstract):
    address = f"@hetcluster-test-{uuid.uuid4().hex}" if abstract else str(tmp_path / "notify.sock")
    with receiver(address) as sock:
        notifier = Notifier({"NOTIFY_SOCKET": address})
        assert notifier.enabled
        assert notifier.ready("serving dev on 127.0.0.1:1")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving dev on 127.0.0.1:1"
        assert notifier.status("busy")
        assert sock.recv(4096) == b"STATUS=busy"
        assert notifier.stopping()
        assert sock.recv(4096) == b"STOPPING=1"


def test_watchdog_pings_at_half_the_timeout_only_while_healthy(tmp_path):
    address = str(tmp_path / "wd.sock")
    healthy = {"ok": True}
    with receiver(address) as sock:
        notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
        assert notifier.watchdog_interval_s == pytest.approx(0.1)
        assert notifier.start_watchdog(lambda: healthy["ok"])
        try:
            assert sock.recv(64) == b"WATCHDOG=1"
            assert sock.recv(64) == b"WATCHDOG=1"
            healthy["ok"] = False
            sock.settimeout(0.35)
            with pytest.raises(socket.timeout):
                while True:  # drain a ping that may have been in flight
                    sock.recv(64)
        finally:
            notifier.stop_watchdog()


def test_no_socket_means_no_op_and_foreign_watchdog_is_ignored():
    notifier = Notifier({})
    assert not notifier.enabled and not notifier.ready() and not notifier.start_watchdog(lambda: True)
    other = Notifier({"NOTIFY_SOCKET": "/nonexistent/sock", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s == 0.0
    assert not other.send("READY=1")  # unreachable socket: logged, not raised

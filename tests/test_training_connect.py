"""Checks the engine makes before TensorFlow is imported: unreachable servers are named."""

from __future__ import annotations

import sys

import pytest

from hetcluster.errors import TrainingError
from hetcluster.training.engine import connect
from hetcluster.training.servers import address_reachable, free_address, free_addresses
from hetcluster.training.spec import ClusterAddresses


def test_unreachable_workers_and_ps_are_named_without_importing_tensorflow():
    pi, jetson, ps, chief = free_addresses(4)
    cluster = ClusterAddresses(workers={"pi": pi, "jetson": jetson}, ps=[ps], chief=chief)
    already_loaded = "tensorflow" in sys.modules
    with pytest.raises(TrainingError, match=r"pi, jetson, ps0") as info:
        connect(cluster)
    assert "To fix" in str(info.value)
    assert already_loaded or "tensorflow" not in sys.modules


def test_address_reachable_sees_a_listening_socket():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert address_reachable(f"127.0.0.1:{sock.getsockname()[1]}")
    assert not address_reachable(free_address("127.0.0.1"))
    assert not address_reachable("not-an-address")

"""Where each task of a cluster is seen inside every task's namespace (pure).

The public spec names each task's forwarding address (``host:port`` of its host's mTLS
listener). Inside each TF process's namespace every task of the launched cluster appears at
``127.0.0.1:<port>``, with one port per task, the same in every namespace; the agent (from the
spec it is sent) and the coordinator compute it with the same function, so a process's cluster
spec is the same local spec everywhere, and a run on a subset of the launched workers keeps each
worker's local port.
"""

from __future__ import annotations

from typing import Mapping, Sequence

LOCAL_HOST = "127.0.0.1"
# Ports inside a fresh namespace are all free; this range only has to avoid the ephemeral ports
# of the "none" isolation fallback, where the tasks share the host's ports.
LOCAL_BASE_PORT = 21000
JOB_ORDER = ("chief", "ps", "worker")


def local_ports(public_spec: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """``{public address: local port}`` for every task of ``public_spec``: jobs in a fixed order
    (chief, ps, worker, then any other by name), tasks by index."""
    jobs = [job for job in JOB_ORDER if job in public_spec]
    jobs += sorted(job for job in public_spec if job not in JOB_ORDER)
    ports: dict[str, int] = {}
    for job in jobs:
        for address in public_spec[job]:
            ports.setdefault(address, LOCAL_BASE_PORT + len(ports))
    return ports


def local_spec(
    public_spec: Mapping[str, Sequence[str]], ports: Mapping[str, int] | None = None
) -> dict[str, list[str]]:
    """``public_spec`` with every address replaced by its local endpoint."""
    ports = ports if ports is not None else local_ports(public_spec)
    return {job: [local_address(ports[address]) for address in addresses] for job, addresses in public_spec.items()}


def local_address(port: int) -> str:
    return f"{LOCAL_HOST}:{port}"

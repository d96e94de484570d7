"""A host's TF processes on the training plane: each spawned into a namespace of its own, routed.

``PlaneHost`` is what an agent (for its workers) and the coordinator (for the parameter servers
and the chief) hold: one :class:`~hetcluster.plane.forwarder.Forwarder`, the tasks of this host
(``LocalTask``, by public address) and the way to reach every other (``RemoteTask`` over mTLS).
``spawn`` starts a TF process with a control socket, puts a listener inside its namespace for
every other task of its cluster, and lets it go on.
"""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hetcluster.plane.forwarder import Exposure, Forwarder, LocalTask, RemoteTask, Target
from hetcluster.plane.link import ChildLink
from hetcluster.plane.localspec import local_ports

log = logging.getLogger(__name__)


@dataclass(eq=False)
class PlaneChild:
    """A spawned TF process: its process, control link and listeners."""

    name: str
    process: subprocess.Popen
    link: ChildLink
    routed: Future = field(repr=False)   # done once its listeners are up and it was told to go

    def exposure(self, timeout_s: float = 60.0) -> Exposure:
        return self.routed.result(timeout_s)


class PlaneHost:
    """The plane of one host. ``client_ssl(address)`` gives the TLS context to reach a remote
    task at that address (the coordinator holds one per device; an agent one for all)."""

    def __init__(self, name: str, *, isolation: str = "netns", server_ssl: ssl.SSLContext | None = None,
                 client_ssl: Callable[[str], ssl.SSLContext] | None = None) -> None:
        self.name = name
        self.isolation = isolation
        self.forwarder = Forwarder(name, server_ssl)
        self._client_ssl = client_ssl
        self.tasks: dict[str, LocalTask] = {}     # this host's tasks by public address
        self._servers: dict[str, Any] = {}

    def add_task(self, public_address: str, name: str, port: int, sock: socket.socket | None = None) -> LocalTask:
        """Register a task of this host; with ``sock`` (bound to its public address) peers reach it
        over mTLS there."""
        task = self.tasks.get(public_address)
        if task is None:
            task = self.tasks[public_address] = LocalTask(name, port)
        if sock is not None:
            self._servers[public_address] = self.forwarder.serve(sock, task)
        return task

    def remove_task(self, public_address: str) -> None:
        self.tasks.pop(public_address, None)
        server = self._servers.pop(public_address, None)
        if server is not None:
            self.forwarder.stop_serving(server)

    def target(self, public_address: str, name: str) -> Target:
        """How a process of this host reaches the task at ``public_address``."""
        local = self.tasks.get(public_address)
        if local is not None:
            return local
        if self._client_ssl is None:
            raise ValueError(f"{self.name} has no TLS credentials to reach {name} at {public_address}")
        return RemoteTask(name, public_address, self._client_ssl(public_address))

    def routes(self, public_spec: Mapping[str, Sequence[str]], own: str | None,
               ports: Mapping[str, int] | None = None) -> dict[int, Target]:
        """{local port: target} for every task of ``public_spec`` but ``own``."""
        ports = ports if ports is not None else local_ports(public_spec)
        return {ports[address]: self.target(address, f"{job}:{index}")
                for job, addresses in public_spec.items() for index, address in enumerate(addresses)
                if address != own}

    def spawn(self, name: str, argv: Sequence[str], routes: Mapping[int, Target], *, watch: bool = False,
              task: LocalTask | None = None, **popen: Any) -> PlaneChild:
        """Start ``argv`` (a program that calls isolation.enter_plane with the ``--plane-fd`` and
        ``--isolation`` arguments appended) and route it; ``task`` (this host's task it runs) is
        given the child's link, so peers reach its server."""
        link, child_end = ChildLink.pair(name)
        command = [*argv, "--plane-fd", str(child_end.fileno()), "--isolation", self.isolation]
        try:
            process = subprocess.Popen(command, pass_fds=(child_end.fileno(),), **popen)
        except BaseException:
            link.close()
            raise
        finally:
            child_end.close()
        if task is not None:
            task.link = link
        routed: Future = Future()

        def route() -> None:
            try:
                exposure = self.forwarder.expose(link, routes, watch=watch)
                link.go()
                routed.set_result(exposure)
            except Exception as error:  # noqa: BLE001 - the child's exit tells the rest
                log.warning("could not route %s: %s", name, error)
                routed.set_exception(error)

        threading.Thread(target=route, name=f"route-{name}", daemon=True).start()
        return PlaneChild(name, process, link, routed)

    def release(self, child: PlaneChild, task: LocalTask | None = None) -> None:
        """Close a child's listeners and control link (after it ended, or to end it)."""
        if task is not None and task.link is child.link:
            task.link = None
        try:
            exposure = child.routed.result(timeout=60.0)
        except Exception:  # noqa: BLE001 - nothing was exposed
            exposure = None
        if exposure is not None:
            self.forwarder.close_exposure(exposure)
        child.link.close()

    def probe(self, public_address: str, name: str = "") -> bool:
        return self.forwarder.probe(self.target(public_address, name or public_address))

    def close(self) -> None:
        self.forwarder.close()

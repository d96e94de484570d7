"""The coordinator host's end of the training plane (hetcluster.plane).

The parameter servers and the chief of a launched cluster each run in a network namespace of
their own; each has a public address on the coordinator host, an mTLS listener through which
the workers' hosts reach it. The workers are reached over mTLS at the forwarding ports their
agents reserved. Every process's cluster spec names local endpoints only; :meth:`local_view`
turns the public addresses of a run into the chief's.

``open_plane`` is a developer-only switch (tests and benchmarks compare against it, through the
environment variable ``HETCLUSTER_DEV_OPEN_TF_PLANE=1`` or the argument): no namespace, no
forwarding, every TF server on its public port as TensorFlow alone would have it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
import subprocess
from typing import TYPE_CHECKING, Any, Sequence

from hetcluster.errors import ConfigError, TrainingError
from hetcluster.plane import tls
from hetcluster.plane.host import PlaneChild, PlaneHost
from hetcluster.plane.isolation import HOW_TO_ALLOW, isolation_problem
from hetcluster.plane.localspec import local_address, local_ports, local_spec
from hetcluster.training.spec import ClusterAddresses

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import DeviceEntry

log = logging.getLogger(__name__)

OPEN_PLANE_ENV = "HETCLUSTER_DEV_OPEN_TF_PLANE"


def open_plane_requested() -> bool:
    """Whether a developer asked for the open plane through the environment."""
    return os.environ.get(OPEN_PLANE_ENV, "") == "1"


@functools.lru_cache(maxsize=1)
def _isolation_problem() -> str | None:
    return isolation_problem()


def check_training_plane(
    devices: Sequence[DeviceEntry], isolation: str = "auto", *, open_plane: bool | None = None
) -> str:
    """Before any server starts: every device has the mutual-TLS files the plane needs (they load),
    and this host can isolate its TF processes. Returns the isolation ("netns" or "none"; "open"
    on the developer's open plane). Raises ConfigError or TrainingError, one line."""
    if open_plane if open_plane is not None else open_plane_requested():
        return "open"
    missing = [d.name for d in devices if not (d.cert_file and d.key_file and d.ca_file)]
    if missing:
        raise ConfigError(f"TF traffic travels only over mutual TLS, and the inventory gives no client certificate, "
                          f"key and CA for {', '.join(missing)}.",
                          hint="set cert_file, key_file and ca_file for every device (hetcluster agent credentials "
                               "makes them; cluster up writes them for the emulated fleet).")
    for device in devices:
        tls.client_context(device.cert_file, device.key_file, [device.ca_file])
    return CoordinatorPlane._isolation(isolation)


class CoordinatorPlane:
    """The TF processes of this host for one launched cluster, and the routes to the others.

    ``host`` is None on the open plane. Public addresses are bound with :meth:`bind` (the
    sockets are held, so no other process can take them), the cluster's public spec fixed with
    :meth:`set_spec`, then servers and chiefs are spawned into it.
    """

    def __init__(self, host: PlaneHost | None, bind_host: str = "127.0.0.1") -> None:
        self.host = host
        self.bind_host = bind_host
        self._held: dict[str, socket.socket] = {}
        self._ports: dict[str, int] = {}
        self._client_ssl: dict[str, ssl.SSLContext] = {}
        self._default_ssl: ssl.SSLContext | None = None

    @property
    def open(self) -> bool:
        return self.host is None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def for_devices(cls, devices: Sequence[DeviceEntry], ps_host: str, *, open_plane: bool | None = None,
                    isolation: str = "auto") -> "CoordinatorPlane":
        """The plane of a cluster of agent ``devices`` (inventory DeviceEntry), with the PS and
        chief on ``ps_host`` (this machine as the devices see it)."""
        if open_plane is None:
            open_plane = open_plane_requested()
        if open_plane:
            log.warning("training plane OPEN (developer switch): TF servers take any client on their ports")
            return cls(None, ps_host)
        isolation_mode = check_training_plane(devices, isolation)
        cas = [d.ca_file for d in devices]
        first = devices[0]
        plane = cls(None, ps_host)
        plane._default_ssl = tls.client_context(first.cert_file, first.key_file, cas)
        contexts: dict[tuple[str, str], ssl.SSLContext] = {
            (str(first.cert_file), str(first.key_file)): plane._default_ssl
        }
        for device in devices:
            key = (str(device.cert_file), str(device.key_file))
            if key not in contexts:
                contexts[key] = tls.client_context(device.cert_file, device.key_file, cas)
            plane._client_ssl[device.name] = contexts[key]
        plane.host = PlaneHost("coordinator", isolation=isolation_mode,
                               server_ssl=tls.server_context(first.cert_file, first.key_file, cas),
                               client_ssl=plane._ssl_for)
        return plane

    @classmethod
    def local(cls, *, open_plane: bool | None = None, isolation: str = "auto") -> "CoordinatorPlane":
        """The plane of a cluster whose every task runs on this host (tests, benchmarks): the
        same namespaces, routed inside this process, no TLS listener."""
        if open_plane if open_plane is not None else open_plane_requested():
            return cls(None)
        return cls(PlaneHost("local", isolation=cls._isolation(isolation)))

    @staticmethod
    def _isolation(isolation: str) -> str:
        if isolation == "none":
            log.warning("tf_plane_isolation = \"none\": the parameter servers and the chief listen on the network "
                        "unauthenticated")
            return "none"
        problem = _isolation_problem()
        if problem is not None:
            raise TrainingError(f"this host cannot give its TF servers a network namespace ({problem}), so their ports "
                                "would be open to the network.",
                                hint=HOW_TO_ALLOW.replace('[tf_plane] isolation = "none"',
                                                          'tf_plane_isolation = "none" in the inventory\'s [cluster]'))
        return "netns"

    def _ssl_for(self, address: str) -> ssl.SSLContext:
        context = self._client_ssl.get(address, self._default_ssl)
        if context is None:
            raise TrainingError(f"no TLS credentials to reach {address}.", hint="check the inventory's certificates.")
        return context

    def register_worker(self, address: str, device: str) -> None:
        """Reach the worker at ``address`` with ``device``'s credentials."""
        if device in self._client_ssl:
            self._client_ssl[address] = self._client_ssl[device]

    # -- addresses ---------------------------------------------------------------------------
    def bind(self, count: int) -> list[str]:
        """``count`` public addresses on this host: ports held bound until the plane closes (the
        open plane only picks free ports, which its TF servers bind themselves)."""
        from hetcluster.training.servers import free_ports

        if self.open:
            return [f"{self.bind_host}:{port}" for port in free_ports(count, "")]
        addresses = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", 0))
            address = f"{self.bind_host}:{sock.getsockname()[1]}"
            self._held[address] = sock
            addresses.append(address)
        return addresses

    def set_spec(self, public_spec: dict[str, list[str]], local: Sequence[str] = ()) -> None:
        """Fix the launched cluster; the tasks at ``local`` addresses run on this host (their
        held sockets, if any, become their mTLS listeners)."""
        self._ports = local_ports(public_spec)
        if self.host is None:
            return
        names = {address: f"{job}:{index}" for job, addresses in public_spec.items()
                 for index, address in enumerate(addresses)}
        served = self._default_ssl is not None
        for address in local:
            sock = self._held.pop(address, None)
            self.host.add_task(address, names[address], self._ports[address], sock if served else None)
            if sock is not None and not served:
                sock.close()

    def child_spec(self, public_spec: dict[str, list[str]]) -> dict[str, list[str]]:
        """The cluster spec a TF process of this host is given."""
        return public_spec if self.open else local_spec(public_spec, self._ports)

    def local_view(self, addresses: ClusterAddresses) -> ClusterAddresses:
        """The addresses of a run as its chief sees them inside its namespace."""
        if self.open:
            return addresses
        return ClusterAddresses(workers={n: local_address(self._ports[a]) for n, a in addresses.workers.items()},
                                ps=[local_address(self._ports[a]) for a in addresses.ps],
                                chief=local_address(self._ports[addresses.chief]))

    # -- processes ---------------------------------------------------------------------------
    def spawn(self, address: str, argv: Sequence[str], public_spec: dict[str, list[str]], *, watch: bool = False,
              **popen: Any) -> tuple[subprocess.Popen, PlaneChild | None]:
        """Start the TF process of this host's task at ``address`` (its argv without the plane's
        arguments), routed to every other task of ``public_spec``; its plane handle is None on
        the open plane."""
        if self.host is None:
            return subprocess.Popen(list(argv), **popen), None
        task = self.host.tasks[address]
        routes = self.host.routes(public_spec, address, self._ports)
        child = self.host.spawn(task.name, argv, routes, watch=watch, task=task, **popen)
        return child.process, child

    def release(self, child: PlaneChild | None, address: str) -> None:
        """Close a child's routes (after it ended or was stopped)."""
        if self.host is not None and child is not None:
            self.host.release(child, self.host.tasks.get(address))

    def probe(self, address: str) -> bool:
        """Whether the server at ``address`` (public) answers end to end."""
        if self.host is None:
            from hetcluster.training.servers import address_reachable

            return address_reachable(address)
        return self.host.probe(address)

    def close(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()
        if self.host is not None:
            self.host.close()

"""Local TF server processes (the parameter server, and workers in tests) and port helpers.

The engine starts the parameter server itself on the coordinator host, as a child process running
the agent's own ``python -m hetcluster.agent.tf_server`` (a plain ``tf.distribute.Server`` that
exits when its parent dies), in a namespace of its own on the training plane
(``CoordinatorPlane``); workers normally come from device agents. A server is "up" once it has
logged that it serves and a connection to it succeeds end to end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from hetcluster.errors import TaskError
from hetcluster.tfenv import tf_env

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.training.plane import CoordinatorPlane

log = logging.getLogger(__name__)


def free_ports(count: int, host: str = "localhost") -> list[int]:
    """``count`` distinct, currently free TCP ports on ``host``: every socket stays bound until
    all are, so the system cannot hand the same port out twice (one released port at a time can
    come back at once, which gave two tasks one address)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def port_bindable(port: int) -> bool:
    """Whether a server could listen on ``port`` on every interface now, as TF's gRPC server binds
    its port (False while another socket listens there; a closed one in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_port(host: str = "localhost") -> int:
    """A currently free TCP port on ``host`` (bind to port 0, read it, release it)."""
    return free_ports(1, host)[0]


def free_addresses(count: int, host: str = "localhost") -> list[str]:
    """``count`` distinct ``host:port`` addresses with currently free ports."""
    return [f"{host}:{port}" for port in free_ports(count, host)]


def free_address(host: str = "localhost") -> str:
    """``host:port`` with a currently free port."""
    return free_addresses(1, host)[0]


def address_reachable(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds now (the server process is alive)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def one_line_tail(text: str, chars: int) -> str:
    """The last ``chars`` characters of a log, its whitespace and newlines folded to single spaces."""
    return " ".join(text[-chars:].split())


def log_file_tail(path: Path | str, chars: int) -> str:
    """The last ``chars`` characters of the log at ``path`` on one line; says so when the log
    cannot be read, so that an error report about a process never fails on its log."""
    try:
        return one_line_tail(Path(path).read_text(errors="replace"), chars)
    except OSError as error:
        return f"(its log is unreadable: {error})"


@dataclass
class LocalServer:
    """A ``tf.distribute.Server`` child process for task ``job:index`` of a cluster spec."""

    job: str
    index: int
    address: str
    process: subprocess.Popen
    log_path: Path
    _tmpdir: tempfile.TemporaryDirectory = field(repr=False)
    plane: "CoordinatorPlane | None" = field(default=None, repr=False)
    child: Any = field(default=None, repr=False)   # its PlaneChild on a closed plane

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def serving(self) -> bool:
        """Whether the server has logged that it serves and its port accepts connections."""
        if b"serving at" not in self.log_path.read_bytes():
            return False
        return self.plane.probe(self.address) if self.plane is not None else address_reachable(self.address)

    def log_tail(self, chars: int) -> str:
        """The last ``chars`` characters of the server's log on one line (:func:`log_file_tail`)."""
        return log_file_tail(self.log_path, chars)

    def startup_error(self) -> TaskError:
        """The error for a server that exited or was late starting, with its log's tail."""
        return TaskError(f"TF server {self.job}:{self.index} at {self.address} did not start: {self.log_tail(800)}",
                         hint="check the port is free and TensorFlow imports in this environment.")

    def kill(self) -> None:
        """SIGKILL the server (used to simulate a lost device)."""
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; removes the temporary files."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.plane is not None and self.child is not None:
            child, self.child = self.child, None
            self.plane.release(child, self.address)
        self._tmpdir.cleanup()


def spawn_local_server(cluster_spec: dict[str, list[str]], job: str, index: int,
                       plane: "CoordinatorPlane | None" = None) -> LocalServer:
    """Start task ``job:index`` as a child process without waiting for it (see wait_until_serving):
    importing TensorFlow takes seconds, so callers start every server first and wait once. With
    ``plane`` (whose spec is ``cluster_spec``) the server runs in its own namespace; without, it
    listens on its address as TensorFlow alone would."""
    tmpdir = tempfile.TemporaryDirectory(prefix=f"hetcluster-{job}{index}-")
    log_path = Path(tmpdir.name) / "server.log"
    env = tf_env()
    spec = plane.child_spec(cluster_spec) if plane is not None else cluster_spec
    cmd = [sys.executable, "-m", "hetcluster.agent.tf_server", "--cluster-spec", json.dumps(spec),
           "--job", job, "--index", str(index), "--parent-pid", str(os.getpid())]
    address = cluster_spec[job][index]
    with open(log_path, "wb") as log_file:
        popen: dict[str, Any] = dict(stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if plane is None:
            process, child = subprocess.Popen(cmd, **popen), None
        else:
            process, child = plane.spawn(address, cmd, cluster_spec, **popen)
    return LocalServer(job, index, address, process, log_path, tmpdir, plane, child)


def wait_until_serving(servers: Sequence[LocalServer], timeout_s: float = 120.0) -> None:
    """Block until every server serves. Raises TaskError (with the child's log tail) for the first
    that exits or is not ready within ``timeout_s``, after stopping all of ``servers``."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.serving()]
        late = time.monotonic() > deadline
        for server in pending:
            if not server.alive() or late:
                error = server.startup_error()
                for other in servers:
                    other.stop()
                raise error
        if pending:
            time.sleep(0.1)
    for server in servers:
        log.info("started %s:%d at %s (pid %d)", server.job, server.index, server.address, server.pid)


def start_local_servers(cluster_spec: dict[str, list[str]], tasks: Sequence[tuple[str, int]],
                        timeout_s: float = 120.0, plane: "CoordinatorPlane | None" = None) -> list[LocalServer]:
    """Start the ``(job, index)`` tasks of ``cluster_spec`` side by side and wait until all serve;
    stops them all if one fails (TaskError)."""
    servers = [spawn_local_server(cluster_spec, job, index, plane) for job, index in tasks]
    wait_until_serving(servers, timeout_s)
    return servers


def start_local_cluster(worker_names: Sequence[str], plane: "CoordinatorPlane | None" = None,
                        timeout_s: float = 120.0) -> tuple[Any, list[LocalServer]]:
    """1 PS and the named workers on this host (tests, benchmarks): on ``plane`` (a
    CoordinatorPlane.local(), which the caller closes) each in a namespace of its own, else each
    on its own port. Returns the run's ClusterAddresses (the chief's included) and the servers,
    PS first."""
    from hetcluster.training.spec import ClusterAddresses

    *workers, ps, chief = free_addresses(len(worker_names) + 2)
    addresses = ClusterAddresses(workers=dict(zip(worker_names, workers)), ps=[ps], chief=chief)
    spec = addresses.cluster_spec_dict()
    if plane is not None:
        plane.set_spec(spec, local=[*workers, ps, chief])
    tasks = [("ps", 0)] + [("worker", i) for i in range(len(worker_names))]
    return addresses, start_local_servers(spec, tasks, timeout_s, plane)


def spawn_parameter_servers(
    cluster_spec: dict[str, list[str]], plane: "CoordinatorPlane | None" = None
) -> list[LocalServer]:
    """Every ``ps`` task of ``cluster_spec`` on this host, started but not waited for."""
    return [spawn_local_server(cluster_spec, "ps", index, plane) for index in range(len(cluster_spec.get("ps", [])))]


"""Bring up the TF servers of one run: a worker on each chosen device (via its agent) and the PS.

Order matters: every address must be in the cluster spec before any server starts, so ports are
reserved on the agents first (they hold the port until StartTask, which makes it the worker's
mTLS forwarding port), the parameter server and chief ports are bound on the coordinator host
(``CoordinatorPlane``), then the PS starts locally and each agent starts its worker, each in a
namespace of its own on the training plane. Every worker holds a lease that ``LaunchedCluster``
renews while it lives; a coordinator that dies stops renewing, and the agents stop its workers. The PS is not waited
for before the workers start: every server imports TensorFlow first
(seconds; tens of seconds on a slow board), so they all start side by side and the launch waits
once (``LaunchedCluster.wait_ready``); with ``wait=False`` the caller starts the training process
too before that wait. ``LaunchedCluster.stop()`` undoes all of it; it is also the context-manager exit.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from hetcluster.errors import AgentError, TaskError
from hetcluster.training.plane import CoordinatorPlane
from hetcluster.training.servers import LocalServer, one_line_tail, spawn_parameter_servers, wait_until_serving
from hetcluster.training.spec import ClusterAddresses

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import DeviceEntry

log = logging.getLogger(__name__)

# A worker whose coordinator is gone stops within this (agents stop tasks whose lease lapsed);
# renewed three times per lease, so one lost renewal never stops a live job.
LEASE_S = 15.0


class DeviceLaunchError(TaskError):
    """A device's agent could not reserve a port or start its worker; ``device`` names it."""

    def __init__(self, device: str, message: str, *, hint: str | None = None) -> None:
        self.device = device
        super().__init__(message, hint=hint)


@dataclass
class LaunchedCluster:
    """Servers of one run: addresses, the agents' task ids, and the local PS processes."""

    addresses: ClusterAddresses
    task_ids: dict[str, str]
    ps_servers: list[LocalServer]
    clients: dict[str, Any] = field(repr=False)
    ready_timeout_s: float = 120.0
    started_s: float = field(default_factory=time.monotonic)  # when the servers were asked to start
    plane: CoordinatorPlane = field(default_factory=lambda: CoordinatorPlane(None), repr=False)
    lease_s: float = LEASE_S
    chiefs: list[str] = field(default_factory=list)   # every chief address, addresses.chief first
    spec: dict[str, list[str]] = field(default_factory=dict)   # the public cluster spec the workers are given
    run_tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _renewing: threading.Event = field(default_factory=threading.Event, repr=False)

    def start_workers(self) -> dict[str, DeviceLaunchError]:
        """Ask every device's agent to start its worker (those not started yet); return
        ``{device: error}`` for those whose agent refused or failed (the others go on starting).
        The ready timeout counts from here."""
        self.started_s = time.monotonic()
        failed: dict[str, DeviceLaunchError] = {}
        for index, name in enumerate(self.addresses.workers):
            if name in self.task_ids:
                continue
            try:
                task = self.clients[name].start_task("worker", index, self.spec, task_id=f"hc-{self.run_tag}-w{index}",
                                                     lease_s=self.lease_s, open_plane=self.plane.open)
            except AgentError as error:
                failed[name] = DeviceLaunchError(name, f"Device {name} could not start its worker: {error}",
                                                 hint="check its agent's log, or leave the device out.")
                continue
            self.task_ids[name] = task.task_id
        return failed

    def lane(self, names: Sequence[str], ps_index: int, chief_index: int | None = None) -> ClusterAddresses:
        """The addresses of a run of ``names`` on one parameter server and one chief (default the
        PS's index): runs that share no worker, PS or chief can train at the same time."""
        chiefs = self.chiefs or [self.addresses.chief]
        return ClusterAddresses(workers={n: self.addresses.workers[n] for n in names}, ps=[self.addresses.ps[ps_index]],
                                chief=chiefs[ps_index if chief_index is None else chief_index])

    def keep_leases(self) -> None:
        """Renew every worker's lease from a daemon thread until stop()."""
        threading.Thread(target=self._renew, name="lease-renewal", daemon=True).start()

    def _renew(self) -> None:
        gone_before: set[str] = set()
        while not self._renewing.wait(self.lease_s / 3.0):
            for name, task_id in list(self.task_ids.items()):
                try:
                    gone = self.clients[name].renew_task_leases([task_id], self.lease_s)
                except AgentError as error:
                    log.debug("renewing the lease of the worker on %s: %s", name, error)
                    continue
                if gone and name not in gone_before:
                    log.warning("the worker on %s no longer runs (its agent reports it gone)", name)
                    gone_before.add(name)

    def wait_ready(self, names: Sequence[str] | None = None) -> None:
        """Block until every worker port (of ``names`` only, when given) accepts connections and
        every PS serves, at most ``ready_timeout_s`` after the start. Raises DeviceLaunchError
        naming a device whose worker died, was lost or was late, or TaskError for a PS; the caller
        stops the cluster (the context manager's exit does)."""
        deadline = self.started_s + self.ready_timeout_s
        _wait_until_listening(self, deadline, names)
        wait_until_serving(self.ps_servers, max(0.0, deadline - time.monotonic()))
        log.info("cluster up: workers %s, ps %s, chief %s", self.addresses.workers, self.addresses.ps,
                 self.addresses.chief)

    def ended_servers(self, tail_chars: int = 300) -> list[str]:
        """One line for each server of this run that is no longer running, for the error of a
        failed run: a PS that exited (exit code, its log's tail) and a worker whose agent reports
        its task ended (state and log tail, as the agent keeps them); an agent that cannot be
        asked is named as such. Empty when every server still runs."""
        ended: list[str] = []
        for server in self.ps_servers:
            if not server.alive():
                ended.append(f"ps:{server.index} exited with code {server.process.returncode}: "
                             f"{server.log_tail(tail_chars)}")
        for name, task_id in self.task_ids.items():
            try:
                tasks = self.clients[name].task_status(task_id)
            except AgentError as error:
                ended.append(f"worker on {name}: its agent did not answer ({error.message})")
                continue
            if tasks and not tasks[0].alive:
                ended.append(f"worker on {name} {tasks[0].state}: {one_line_tail(tasks[0].message, tail_chars)}")
        return ended

    def stop(self) -> dict[str, str]:
        """Stop every worker task and PS; return ``{device: error}`` for stops that failed."""
        self._renewing.set()
        failures: dict[str, str] = {}
        for name, task_id in self.task_ids.items():
            try:
                self.clients[name].stop_task(task_id)
            except AgentError as error:
                failures[name] = str(error)
                log.warning("could not stop the worker on %s: %s", name, error)
        for server in self.ps_servers:
            server.stop()
        for client in self.clients.values():
            client.close()
        self.plane.close()
        self.task_ids, self.ps_servers = {}, []
        return failures

    def __enter__(self) -> "LaunchedCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_cluster(devices: Sequence[DeviceEntry], ps_host: str, *, num_ps: int = 1, ready_timeout_s: float = 120.0,
                   client_timeout_s: float = 10.0, wait: bool = True, isolation: str = "auto",
                   open_plane: bool | None = None, lease_s: float = LEASE_S, lanes: int = 1,
                   start_workers: bool = True) -> LaunchedCluster:
    """Start a worker on each inventory ``DeviceEntry`` in ``devices`` and ``num_ps`` local PS.

    ``lanes``: how many chief addresses; with as many parameter servers, runs on disjoint workers
    can train at once, each on its own PS and chief (``LaunchedCluster.lane``).

    The coordinator (chief) and PS are reached at ``ps_host``, which must be this machine as the
    devices see it. Raises DeviceLaunchError naming the first device that failed (everything
    started so far is stopped again). With ``wait=False`` it returns once every server was asked
    to start, and the caller calls ``wait_ready()`` (run_job.run_in_subprocess(ready=...) does,
    while the training process imports TensorFlow); with ``start_workers=False`` too, only the
    PS starts, and ``LaunchedCluster.start_workers()`` asks the agents later. ``isolation`` is the inventory's
    ``tf_plane_isolation``; ``open_plane`` the developer-only switch (CoordinatorPlane).
    """
    plane = CoordinatorPlane.for_devices(devices, ps_host, open_plane=open_plane, isolation=isolation)
    try:
        return _launch(devices, plane, num_ps, ready_timeout_s, client_timeout_s,
                       wait and start_workers, lease_s, lanes, start_workers)
    except BaseException:
        plane.close()
        raise


def _launch(devices: Sequence[DeviceEntry], plane: CoordinatorPlane, num_ps: int, ready_timeout_s: float,
            client_timeout_s: float, wait: bool, lease_s: float, lanes: int = 1,
            start_workers: bool = True) -> LaunchedCluster:
    clients = {d.name: d.client(timeout_s=client_timeout_s) for d in devices}
    workers: dict[str, str] = {}
    for device in devices:
        try:
            workers[device.name] = clients[device.name].reserve_port(ttl_s=ready_timeout_s + 60.0)
        except AgentError as error:
            _close(clients)
            raise DeviceLaunchError(device.name, f"Device {device.name}: {error}",
                                    hint="check its agent, or leave the device out.") from error
        plane.register_worker(workers[device.name], device.name)
    bound = plane.bind(num_ps + lanes)
    ps, chiefs = bound[:num_ps], bound[num_ps:]
    addresses = ClusterAddresses(workers=workers, ps=ps, chief=chiefs[0])
    spec = {**addresses.cluster_spec_dict(), "chief": chiefs}
    plane.set_spec(spec, local=bound)
    launched = LaunchedCluster(addresses, {}, spawn_parameter_servers(spec, plane), clients, ready_timeout_s,
                               plane=plane, lease_s=lease_s, chiefs=chiefs, spec=spec)
    try:
        launched.keep_leases()
        if start_workers:
            failed = launched.start_workers()
            if failed:
                raise next(iter(failed.values()))
        if wait:
            launched.wait_ready()
    except BaseException:
        launched.stop()
        raise
    return launched


def _wait_until_listening(launched: LaunchedCluster, deadline: float, names: Sequence[str] | None = None) -> None:
    """Block until every worker port (of ``names``, default all) accepts connections (at most
    until the monotonic ``deadline``); fail fast if a task or a PS dies."""
    pending = {n: a for n, a in launched.addresses.workers.items() if names is None or n in names}
    while pending:
        for server in launched.ps_servers:  # started beside the workers: a PS that died fails the launch now
            if not server.alive():
                raise server.startup_error()
        for name, address in list(pending.items()):
            if launched.plane.probe(address):
                del pending[name]
                continue
            try:
                tasks = launched.clients[name].task_status(launched.task_ids[name])
            except AgentError as error:
                raise DeviceLaunchError(name, f"Lost the agent of {name} while its worker started: {error}",
                                        hint="check the device, or leave it out.") from error
            if tasks and not tasks[0].alive:
                raise DeviceLaunchError(name, f"The worker on {name} exited ({tasks[0].state}): {tasks[0].message}",
                                        hint="see the agent's task log on that device.")
        if pending and time.monotonic() > deadline:
            name = next(iter(pending))
            raise DeviceLaunchError(
                name,
                f"The worker on {name} ({pending[name]}) did not listen within {launched.ready_timeout_s:.0f} s.",
                hint="check the device's load and network.",
            )
        if pending:
            time.sleep(0.2)


def _close(clients: dict[str, Any]) -> None:
    for client in clients.values():
        client.close()

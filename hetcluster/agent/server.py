"""Assembling and running an agent: gRPC server, auth, health, reflection, port file, signals.

`AgentServer` is what tests and the emulator embed (start on port 0, read `.port`, stop);
`serve()` is what `hetcluster agent serve` runs: it adds SIGTERM/SIGINT handling and the systemd
notify protocol, and stops every task before it exits.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hetcluster.agent import auth
from hetcluster.agent.config import AgentConfig, join_host_port, split_host_port
from hetcluster.agent.deviceinfo import collect_device_info
from hetcluster.agent.notify import Notifier
from hetcluster.agent.servicer import AgentServicer
from hetcluster.agent.state import AgentState
from hetcluster.errors import AgentError
from hetcluster.fileio import write_text_atomic
from hetcluster.power.base import PowerSource
from hetcluster.proto.v1 import agent_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "hetcluster.v1.Agent"
# Threads for every call; long power streams are capped well below it (AgentState.streams), so
# health checks and task control always find a thread, whatever the streams do.
MAX_WORKERS = 48


def open_configured_power_source(config: AgentConfig) -> PowerSource:
    from hetcluster.power import open_source

    return open_source(config.power_config())


class AgentServer:
    """One agent on a real gRPC server. ``power_source`` may be injected (tests, emulator)."""

    def __init__(
        self,
        config: AgentConfig,
        power_source: PowerSource | None = None,
        *,
        root: Path = Path("/"),
        probe_hardware: bool = True,
    ) -> None:
        self.config = config
        # credentials first: a missing file must fail before anything is opened
        interceptor = auth.server_interceptor(config.auth)
        credentials = auth.server_credentials(config.auth)
        source = power_source if power_source is not None else open_configured_power_source(config)
        info = collect_device_info(config, source.name, root=root, probe_hardware=probe_hardware)
        self.state = AgentState(config, source, info)
        try:
            _check_port_free(config.listen)
        except AgentError:
            self.state.close()
            raise
        self._health = health.HealthServicer()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="agent-rpc"),
            interceptors=[interceptor],
            # a second process must not share the port (SO_REUSEPORT would split the calls between them)
            options=[("grpc.so_reuseport", 0)],
        )
        agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(self.state), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self._server)
        try:
            if credentials is None:
                if config.listen_host not in ("127.0.0.1", "localhost", "::1"):
                    log.warning(
                        "agent %s serves without TLS on %s: the token travels in clear text", config.name, config.listen
                    )
                self.port = self._server.add_insecure_port(config.listen)
            else:
                self.port = self._server.add_secure_port(config.listen, credentials)
        except RuntimeError as error:
            self.port = 0
            reason = str(error).split(";")[0].rstrip(".")
        else:
            reason = "the address could not be bound"
        if not self.port:
            self.state.close()
            raise AgentError(
                f"cannot listen on {config.listen}: {reason}.",
                hint="pick a free port or another address in agent.listen.",
            )
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        """Where clients reach this agent (wildcard listen hosts become the task host)."""
        host = self.config.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = self.config.task_host()
        return join_host_port(host, self.port)

    @property
    def tls(self) -> bool:
        return self.config.auth.tls

    def start(self) -> "AgentServer":
        self._server.start()
        self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        if self.config.port_file is not None:
            write_text_atomic(self.config.port_file, self.address + "\n")
        log.info("agent %s serving on %s (%s)", self.config.name, self.address, "TLS" if self.tls else "plaintext")
        return self

    def healthy(self) -> bool:
        return not self._stopped.is_set() and not self.state.stopping.is_set()

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls, stop every task, end streams, release the power source."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        self.state.close(grace_s)
        self._server.stop(grace=min(grace_s, 2.0)).wait()
        if self.config.port_file is not None:
            self.config.port_file.unlink(missing_ok=True)
        log.info("agent %s stopped", self.config.name)

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout_s)

    def __enter__(self) -> "AgentServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_port_free(listen: str) -> None:
    """Refuse a port another process listens on, before gRPC tries (and logs its own failure)."""
    host, port = split_host_port(listen, what="agent.listen")
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise AgentError(
            f"cannot listen on {listen}: {error.strerror}.", hint="use an address of this host in agent.listen."
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise AgentError(
                f"cannot listen on {listen}: {error.strerror} (another agent?).",
                hint="pick a free port or another address in agent.listen (or stop the other process).",
            ) from None


def serve(config: AgentConfig, power_source: PowerSource | None = None) -> None:
    """Run the agent until SIGTERM or SIGINT; then stop every task and exit."""
    notifier = Notifier()
    server = AgentServer(config, power_source).start()
    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop_requested.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        notifier.ready(f"serving {config.name} on {server.address}")
        notifier.start_watchdog(server.healthy)
        while not stop_requested.wait(1.0):
            pass
    finally:
        notifier.stopping("stopping tasks")
        notifier.stop_watchdog()
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""The agent's end of the training plane: may this device run a TF task, and its PlaneHost.

A TF task needs the agent's mutual-TLS credentials (its certificate serves the task's
forwarding port and presents it to other hosts; its client CA is the fleet's) and, unless the
operator opted out, a kernel that lets a child process make a network namespace. Both are
checked at the first StartTask (the isolation check runs a short child process once); a device
that cannot gets a one-line reason instead of an open TF port.
"""

from __future__ import annotations

import logging
import threading

from hetcluster.agent.config import AgentConfig
from hetcluster.errors import TaskError
from hetcluster.plane import tls
from hetcluster.plane.host import PlaneHost
from hetcluster.plane.isolation import HOW_TO_ALLOW, isolation_problem

log = logging.getLogger(__name__)


class PlaneUnavailable(TaskError):
    """This agent cannot run TF tasks on a closed training plane (FAILED_PRECONDITION)."""


class AgentPlane:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._host: PlaneHost | None = None
        self._lock = threading.Lock()

    def host(self) -> PlaneHost:
        """The plane, made at the first call; raises PlaneUnavailable with the reason."""
        with self._lock:
            if self._host is None:
                self._host = self._make()
            return self._host

    def _make(self) -> PlaneHost:
        auth = self._config.auth
        if auth.cert_file is None or auth.key_file is None or auth.client_ca_file is None:
            raise PlaneUnavailable(
                "this agent has no mutual-TLS credentials, and TF traffic travels only over mutual TLS.",
                hint="set [auth] cert_file, key_file and client_ca_file (hetcluster agent credentials makes them).",
            )
        isolation = "none" if self._config.tf_plane.isolation == "none" else "netns"
        if isolation == "netns":
            problem = isolation_problem()
            if problem is not None:
                raise PlaneUnavailable(f"this device cannot give its TF servers a network namespace ({problem}), "
                                       "so their ports would be open to the network.", hint=HOW_TO_ALLOW)
        else:
            log.warning('[tf_plane] isolation = "none": this agent\'s TF servers listen on the network unauthenticated')
        server_ssl = tls.server_context(auth.cert_file, auth.key_file, [auth.client_ca_file])
        client_ssl = tls.client_context(auth.cert_file, auth.key_file, [auth.client_ca_file])
        return PlaneHost(
            self._config.name, isolation=isolation, server_ssl=server_ssl, client_ssl=lambda _address: client_ssl
        )

    def close(self) -> None:
        with self._lock:
            host, self._host = self._host, None
        if host is not None:
            host.close()

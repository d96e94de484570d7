"""Port reservations: a bound socket held per reserved port until a task takes it or it expires.

A coordinator must write the whole cluster spec before any TF server starts, so it asks each
agent for a port first. Holding the bound socket keeps other processes from taking the port in
between; StartTask takes it over as the task's mTLS forwarding port (or, on the developer-only
open plane, releases it just before the TF server binds it). A caller (peer host) holds at most
``MAX_PER_CALLER`` reservations at once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass

from hetcluster.agent.config import join_host_port
from hetcluster.errors import AgentError

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 60.0
MAX_TTL_S = 3600.0
MAX_PER_CALLER = 32


class TooManyReservations(AgentError):
    """A caller already holds MAX_PER_CALLER reservations (RESOURCE_EXHAUSTED)."""


@dataclass
class _Reservation:
    sock: socket.socket
    expires_s: float
    caller: str = ""


class PortReservations:
    def __init__(self, advertised_host: str, bind_host: str = "") -> None:
        self._advertised_host = advertised_host
        self._bind_host = bind_host
        self._held: dict[int, _Reservation] = {}
        self._lock = threading.Lock()

    def reserve(self, ttl_s: float = DEFAULT_TTL_S, caller: str = "") -> str:
        """Bind a free port and hold it for ``ttl_s``; return the advertised "host:port"."""
        ttl = min(ttl_s if ttl_s > 0 else DEFAULT_TTL_S, MAX_TTL_S)
        with self._lock:
            self._expire_locked()
            if sum(r.caller == caller for r in self._held.values()) >= MAX_PER_CALLER:
                raise TooManyReservations(
                    f"{caller or 'this caller'} already holds {MAX_PER_CALLER} port reservations.",
                    hint="start tasks on the ports you hold, or wait for them to expire.",
                )
        family = socket.AF_INET6 if ":" in self._bind_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._bind_host, 0))
        port = sock.getsockname()[1]
        with self._lock:
            self._held[port] = _Reservation(sock, time.monotonic() + ttl, caller)
        log.debug("reserved port %d for %.0f s", port, ttl)
        return join_host_port(self._advertised_host, port)

    def take(self, port: int) -> socket.socket | None:
        """The held socket for ``port``, no longer held here (None when it was not reserved)."""
        with self._lock:
            self._expire_locked()
            reservation = self._held.pop(port, None)
        return reservation.sock if reservation is not None else None

    def release(self, port: int) -> bool:
        """Close the held socket for ``port`` (True when it was reserved)."""
        with self._lock:
            self._expire_locked()
            reservation = self._held.pop(port, None)
        if reservation is None:
            return False
        reservation.sock.close()
        return True

    def held_ports(self) -> list[int]:
        with self._lock:
            self._expire_locked()
            return sorted(self._held)

    def close(self) -> None:
        with self._lock:
            held, self._held = self._held, {}
        for reservation in held.values():
            reservation.sock.close()

    def _expire_locked(self) -> None:
        now = time.monotonic()
        for port in [p for p, r in self._held.items() if r.expires_s <= now]:
            self._held.pop(port).sock.close()
            log.debug("port reservation %d expired", port)

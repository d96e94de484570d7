"""The systemd notify protocol (sd_notify) without libsystemd: one datagram per message.

systemd passes the socket path in $NOTIFY_SOCKET (a leading '@' means the abstract namespace) and,
with WatchdogSec=, the deadline in $WATCHDOG_USEC. Outside systemd the variable is unset and every
call is a no-op, so the agent runs the same on a Pi under runit or in a test.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable, Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address = ("\0" + address[1:]) if address.startswith("@") else address
        self._watchdog_usec = _int(env.get("WATCHDOG_USEC", ""))
        watchdog_pid = _int(env.get("WATCHDOG_PID", ""))
        if watchdog_pid and watchdog_pid != os.getpid():
            self._watchdog_usec = 0  # the watchdog is meant for another process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    @property
    def watchdog_interval_s(self) -> float:
        """Half of systemd's watchdog timeout; 0 when no watchdog is configured."""
        return self._watchdog_usec / 2e6 if self.enabled else 0.0

    def send(self, *lines: str) -> bool:
        """Send "KEY=value" lines in one datagram; False (logged) when it could not be sent."""
        if not self.enabled:
            return False
        payload = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self._address)
            return True
        except OSError as error:
            log.warning("sd_notify %s failed: %s", lines, error)
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *((f"STATUS={status}",) if status else ()))

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *((f"STATUS={status}",) if status else ()))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def start_watchdog(self, healthy: Callable[[], bool]) -> bool:
        """Ping WATCHDOG=1 every half timeout from a thread, skipping pings while not healthy
        (so systemd restarts a wedged agent). False when no watchdog is configured."""
        interval_s = self.watchdog_interval_s
        if interval_s <= 0 or self._thread is not None:
            return False

        def loop() -> None:
            while not self._stop.wait(interval_s):
                if healthy():
                    self.send("WATCHDOG=1")
                else:
                    log.warning("agent unhealthy; withholding the systemd watchdog ping")

        self._thread = threading.Thread(target=loop, name="sd-watchdog", daemon=True)
        self._thread.start()
        return True

    def stop_watchdog(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0

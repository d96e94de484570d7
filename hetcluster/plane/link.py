"""The parent's side of a plane child's control socket (see :mod:`isolation`)."""

from __future__ import annotations

import socket
import threading
from typing import Sequence

from hetcluster.errors import TaskError
from hetcluster.plane.isolation import REPLY_SOCKET, REQUEST_GO, REQUEST_SOCKET


class ChildGone(TaskError):
    """The plane child closed its control socket (it exited)."""


class ChildLink:
    """Requests to one plane child: sockets made in its namespace, and the go-ahead."""

    def __init__(self, control: socket.socket, name: str) -> None:
        self.name = name
        self._control = control
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def pair(name: str) -> tuple["ChildLink", socket.socket]:
        """A new link and the socket to hand to the child (``pass_fds``; close it after the spawn)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return ChildLink(parent, name), child

    def socket(self, timeout_s: float = 30.0) -> socket.socket:
        """A TCP socket that lives in the child's namespace (blocking; it waits while the child is
        stopped, e.g. by a duty cycle)."""
        with self._lock:
            if self._closed:
                raise ChildGone(f"the TF process {self.name} is gone.")
            self._control.settimeout(timeout_s)
            try:
                self._control.sendall(REQUEST_SOCKET)
                message, fds, _flags, _addr = socket.recv_fds(self._control, 1, 1)
            except OSError as error:
                raise ChildGone(f"the TF process {self.name} did not answer: {error}.") from None
            if message != REPLY_SOCKET or len(fds) != 1:
                _close_all(fds)
                raise ChildGone(f"the TF process {self.name} is gone.")
        return socket.socket(fileno=fds[0])

    def go(self) -> None:
        with self._lock:
            try:
                self._control.sendall(REQUEST_GO)
            except OSError as error:
                raise ChildGone(f"the TF process {self.name} is gone: {error}.") from None

    def close(self) -> None:
        """Close the control socket: the child exits when it reads the end of file."""
        with self._lock:
            self._closed = True
        self._control.close()

    @property
    def closed(self) -> bool:
        return self._closed


def _close_all(fds: Sequence[int]) -> None:
    import os

    for fd in fds:
        os.close(fd)

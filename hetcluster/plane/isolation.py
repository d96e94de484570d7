"""The child's side of the plane: leave the host's network, then serve sockets to the parent.

A TF process calls :func:`enter_plane` first thing, before it imports TensorFlow or starts a
thread (a new user namespace needs a single-threaded caller, and a network namespace holds only
for the threads started after it). It unshares a network namespace (as root; otherwise a user
namespace with it, which unprivileged users may make where the kernel allows), brings loopback
up, and then answers its parent on the control socket it inherited:

- ``S``: a fresh TCP socket made in this namespace, sent back with SCM_RIGHTS (the parent listens
  on it for this process's outgoing connections, or connects through it to this process's server);
- ``G``: the routes are in place, go on.

When the parent goes away (end of file on the control socket) the process exits: a TF server
outlives neither its agent nor its coordinator.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import socket
import struct
import subprocess
import sys
import threading

from hetcluster.errors import TaskError

log = logging.getLogger(__name__)

ISOLATIONS = ("netns", "none")
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
REQUEST_SOCKET = b"S"
REQUEST_GO = b"G"
REPLY_SOCKET = b"s"
EXIT_PARENT_GONE = 3


class IsolationError(TaskError):
    """This host cannot give a TF process a network namespace of its own."""


def isolate_network() -> None:
    """Move this (single-threaded) process into a new network namespace with loopback up.

    Root makes a plain network namespace; anyone else (or root without CAP_SYS_ADMIN) a user
    namespace that owns one, with its own uid and gid mapped to themselves so files keep their
    owner. Raises IsolationError naming the kernel's reason."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0 or libc.unshare(CLONE_NEWNET) != 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            raise IsolationError(f"cannot make a network namespace: {os.strerror(ctypes.get_errno())}",
                                 hint=HOW_TO_ALLOW)
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w", encoding="ascii") as file:
                    file.write(text)
        except OSError as error:
            raise IsolationError(
                f"cannot map this user into its namespace: {error.strerror}", hint=HOW_TO_ALLOW
            ) from None
    _loopback_up()


HOW_TO_ALLOW = ("allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on Ubuntu 24.04 "
                "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile with userns), run the "
                "agent as root, or opt out with [tf_plane] isolation = \"none\" (its TF servers are then "
                "reachable from the network).")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0) + bytes(22)
        try:
            flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP) + bytes(22))
        except OSError as error:
            raise IsolationError(f"cannot bring loopback up in the new namespace: {error.strerror}",
                                 hint=HOW_TO_ALLOW) from None


def isolation_problem() -> str | None:
    """None when a child process of this one can isolate itself, else the reason in one line
    (run in a fresh interpreter: unsharing needs a single-threaded process)."""
    code = ("import sys\nfrom hetcluster.plane.isolation import IsolationError, isolate_network\n"
            "try:\n    isolate_network()\nexcept IsolationError as error:\n    sys.exit(error.message)")
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot run the isolation check: {error}"
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return lines[-1].split(": ", 1)[-1] if lines else f"the isolation check exited with {result.returncode}"


def enter_plane(control_fd: int, isolation: str = "netns") -> threading.Event:
    """Isolate this process (unless ``isolation`` is "none") and serve the parent's requests on
    ``control_fd`` in a daemon thread; the event is set once the parent says go (its routes are
    in place): wait for it before the first TF connection."""
    if isolation not in ISOLATIONS:
        raise IsolationError(f"unknown isolation {isolation!r}", hint=f"use one of {', '.join(ISOLATIONS)}.")
    if isolation == "netns":
        isolate_network()
    control = socket.socket(fileno=control_fd)
    go = threading.Event()
    threading.Thread(target=_serve, args=(control, go), name="plane-control", daemon=True).start()
    return go


def _serve(control: socket.socket, go: threading.Event) -> None:
    while True:
        try:
            request = control.recv(1)
        except OSError:
            request = b""
        if not request:
            os._exit(EXIT_PARENT_GONE)  # the parent is gone: nobody may use this process any more
        if request == REQUEST_GO:
            go.set()
        elif request == REQUEST_SOCKET:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                socket.send_fds(control, [REPLY_SOCKET], [sock.fileno()])
            finally:
                sock.close()


def listening_ports(pid: int) -> set[int]:
    """TCP ports listening in the network namespace of process ``pid`` (read from its
    /proc/<pid>/net/tcp{,6}; psutil reads the caller's namespace only)."""
    ports: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii") as table:
                next(table, None)
                for line in table:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports

"""One host's end of the training plane: an asyncio loop that splices TF connections.

Three kinds of connection, each spliced byte for byte once both ends are open:

- **into a child** (inbound): the host's mTLS listener for one of its tasks accepts a peer whose
  certificate the fleet's CA signed, reads a one-byte header, connects through a socket made in
  the task's namespace to its server's local port, and answers ``+`` (or ``-`` when the task is
  gone). Header ``P`` is a probe: the answer and nothing else.
- **out of a child**: a listener inside a child's namespace at another task's local port accepts
  the child's connection and connects onward: to a task of this host directly, or over mTLS to
  the remote host's listener for that task (header ``C``, data only after ``+``).
- With ``watch``, a listener for another task is closed while that task, once seen up, does not
  answer probes, so a process that checks whether a port accepts connections (the coordinator
  does, for lost workers) sees the task as it is, not the forwarder.

Everything runs on one event loop in a daemon thread; the public methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from hetcluster.errors import TaskError
from hetcluster.plane.link import ChildGone, ChildLink
from hetcluster.plane.localspec import LOCAL_HOST
from hetcluster.plane.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger(__name__)

CONNECT = b"C"
PROBE = b"P"
ACCEPTED = b"+"
REFUSED = b"-"
HEADER_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
WATCH_PERIOD_S = 1.0
LISTEN_BACKLOG = 128
T = TypeVar("T")


@dataclass(eq=False)
class LocalTask:
    """A task of this host: the plane child that runs it (None while no process does) and the
    port its server listens on inside the child's namespace."""

    name: str
    port: int
    link: ChildLink | None = None


@dataclass(frozen=True, eq=False)
class RemoteTask:
    """A task of another host, reached over mTLS at that host's listener for it."""

    name: str
    address: str
    ssl_context: ssl.SSLContext = field(repr=False)


Target = LocalTask | RemoteTask


def _new_loop() -> asyncio.AbstractEventLoop:
    """Uvloop where it is installed (its TLS and transports are compiled), else asyncio's own."""
    if os.environ.get("HETCLUSTER_PLANE_LOOP", "") != "asyncio":
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


class _Pipe(asyncio.BufferedProtocol):
    """One end of a spliced pair: what it reads goes to ``peer``, and ``peer``'s backpressure
    pauses its reading. Before the splice it buffers, so a header can be read first. It reads into
    a buffer of its own (a TLS transport fills it with many records per call, not one a call)."""

    READ_BUFFER_BYTES = 256 * 1024

    def __init__(self, pipes: set["_Pipe"], on_made: Callable[["_Pipe"], Awaitable[None]] | None = None) -> None:
        self.transport: Any = None
        self._buffer = memoryview(bytearray(self.READ_BUFFER_BYTES))
        self._on_made = on_made
        self.peer: _Pipe | None = None
        self.lost = False
        self._pipes = pipes
        self._pending = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._pipes.add(self)
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP; ours (reserved ports,
        # a child's sockets) are not, and Nagle's delay meets the peer's delayed ACK: 40 ms a reply
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._on_made is not None:  # after the TLS handshake, on a TLS listener
            self._task = asyncio.get_running_loop().create_task(self._on_made(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # a copy: the buffer is read into again while the peer's transport may still hold this
        data = bytes(self._buffer[:nbytes])
        if self.peer is not None:
            self.peer.transport.write(data)
            return
        self._pending += data
        self._wake()

    def eof_received(self) -> bool:
        if self.peer is not None and not self.peer.transport.is_closing() and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
            # half-closed until the peer ends too (a TLS transport cannot stay half-open)
            return self.transport.get_extra_info("sslcontext") is None
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pipes.discard(self)
        self._wake()
        if self.peer is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and not self.peer.transport.is_closing():
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.transport.is_closing():
            self.peer.transport.resume_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read_byte(self, timeout_s: float) -> bytes:
        """The next byte before the splice (empty when the connection ended or time ran out)."""
        if not self._pending and not self.lost:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout_s)
            except asyncio.TimeoutError:
                return b""
        if not self._pending:
            return b""
        byte = bytes(self._pending[:1])
        del self._pending[:1]
        return byte

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _splice(a: _Pipe, b: _Pipe) -> None:
    a.peer, b.peer = b, a
    for src, dst in ((a, b), (b, a)):
        if src._pending:
            dst.transport.write(bytes(src._pending))
            src._pending.clear()
    if a.lost or b.lost:
        a.close()
        b.close()


@dataclass(eq=False)
class Exposure:
    """The listeners a forwarder holds inside one child's namespace (see Forwarder.expose)."""

    link: ChildLink
    routes: dict[int, Target]
    watch: bool
    servers: dict[int, asyncio.AbstractServer | None] = field(default_factory=dict)
    watchers: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class Forwarder:
    """The splicing loop of one host. ``server_ssl``: the context of its mTLS listeners (None on
    a host that only routes between its own children, as a local test cluster does)."""

    def __init__(self, name: str, server_ssl: ssl.SSLContext | None = None) -> None:
        self.name = name
        self._server_ssl = server_ssl
        self._loop = _new_loop()
        self._pipes: set[_Pipe] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._exposures: list[Exposure] = []
        self._errors: dict[str, str] = {}  # the last failure per remote task, logged once per change
        self._seen_up: weakref.WeakSet[Any] = weakref.WeakSet()   # tasks that answered once
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"plane-{name}", daemon=True)
        self._thread.start()
        self._closed = False

    # -- thread-safe API ---------------------------------------------------------------------
    def _call(self, coro: Awaitable[T], timeout_s: float = 60.0) -> T:
        if self._closed:
            raise TaskError(f"the training plane of {self.name} is closed.")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)  # type: ignore[arg-type]

    def serve(self, sock: socket.socket, task: LocalTask) -> asyncio.AbstractServer:
        """Accept mTLS peers on ``sock`` (bound, listening or not) for ``task``."""
        if self._server_ssl is None:
            raise TaskError(f"the training plane of {self.name} has no TLS credentials to serve {task.name}.",
                            hint="give the host a certificate, key and CA (mutual TLS).")
        return self._call(self._serve(sock, task))

    def expose(self, link: ChildLink, routes: Mapping[int, Target], *, watch: bool = False) -> Exposure:
        """Listen inside ``link``'s namespace at each local port of ``routes`` for the task
        there. With ``watch``, remote tasks' listeners follow their liveness (module docstring)."""
        exposure = Exposure(link, dict(routes), watch)
        self._call(self._expose(exposure))
        return exposure

    def close_exposure(self, exposure: Exposure) -> None:
        """Close one child's listeners (they keep its namespace alive)."""
        if not self._closed:
            self._call(self._close_exposure(exposure))

    def probe(self, target: Target, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
        """Whether ``target``'s server accepts a connection now, end to end."""
        return self._call(self._probe(target), timeout_s + HEADER_TIMEOUT_S + 5.0)

    def stop_serving(self, server: asyncio.AbstractServer) -> None:
        if not self._closed:
            self._call(self._stop_server(server))

    def close(self) -> None:
        """Close every listener and connection and stop the loop."""
        if self._closed:
            return
        try:
            self._call(self._shutdown(), 10.0)
        except Exception:  # noqa: BLE001 - closing must not fail the caller's own shutdown
            log.exception("closing the training plane of %s", self.name)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)

    # -- on the loop -------------------------------------------------------------------------
    async def _serve(self, sock: socket.socket, task: LocalTask) -> asyncio.AbstractServer:
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)

        server = await self._loop.create_server(lambda: _Pipe(self._pipes, lambda pipe: self._inbound(pipe, task)),
                                                sock=sock, ssl=self._server_ssl,
                                                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        self._servers.append(server)
        return server

    async def _inbound(self, pipe: _Pipe, task: LocalTask) -> None:
        header = await pipe.read_byte(HEADER_TIMEOUT_S)
        if header not in (CONNECT, PROBE):
            pipe.close()
            return
        inner = await self._connect_local(task)
        if pipe.lost or inner is None:
            if not pipe.lost:
                pipe.transport.write(REFUSED)
            pipe.close()
            if inner is not None:
                inner.close()
            return
        pipe.transport.write(ACCEPTED)
        if header == PROBE:
            inner.close()
            pipe.close()
            return
        _splice(pipe, inner)

    async def _connect_local(self, task: LocalTask) -> _Pipe | None:
        link = task.link
        if link is None or link.closed:
            return None
        try:
            sock = await self._loop.run_in_executor(None, link.socket)
        except ChildGone:
            return None
        sock.setblocking(False)
        try:
            await asyncio.wait_for(self._loop.sock_connect(sock, (LOCAL_HOST, task.port)), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            sock.close()
            return None
        _transport, pipe = await self._loop.connect_accepted_socket(lambda: _Pipe(self._pipes), sock)
        self._seen_up.add(task)
        return pipe

    async def _connect_remote(
        self, task: RemoteTask, header: bytes, timeout_s: float = CONNECT_TIMEOUT_S
    ) -> _Pipe | None:
        host, _, port = task.address.rpartition(":")
        try:
            _transport, pipe = await asyncio.wait_for(
                self._loop.create_connection(lambda: _Pipe(self._pipes), host.strip("[]"), int(port),
                                             ssl=task.ssl_context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S),
                timeout_s)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ValueError) as error:
            self._note(task, header, f"cannot reach {task.address}: {error or type(error).__name__}")
            return None
        pipe.transport.write(header)
        reply = await pipe.read_byte(HEADER_TIMEOUT_S)
        if reply != ACCEPTED:
            pipe.close()
            self._note(task, header, f"its host at {task.address} has no running task for it")
            return None
        self._note(task, header, "")
        self._seen_up.add(task)
        return pipe

    def _note(self, task: RemoteTask, header: bytes, error: str) -> None:
        """Log a TF connection's failure once per change (probes fail quietly: that is their answer)."""
        if header == PROBE:
            log.debug("probe of %s: %s", task.name, error or "up")
        elif self._errors.get(task.name, "") != error:
            self._errors[task.name] = error
            if error:
                log.warning("training plane of %s: %s: %s", self.name, task.name, error)
            else:
                log.info("training plane of %s: %s reachable again", self.name, task.name)

    async def _open(self, target: Target, header: bytes) -> _Pipe | None:
        if isinstance(target, LocalTask):
            return await self._connect_local(target)
        return await self._connect_remote(target, header)

    async def _probe(self, target: Target) -> bool:
        pipe = await self._open(target, PROBE)
        if pipe is None:
            return False
        pipe.close()
        return True

    async def _outbound(self, pipe: _Pipe, target: Target) -> None:
        inner = await self._open(target, CONNECT)
        if inner is None or pipe.lost:
            pipe.close()
            if inner is not None:
                inner.close()
            return
        _splice(pipe, inner)

    async def _listen_in(self, exposure: Exposure, port: int) -> None:
        target = exposure.routes[port]
        sock = await self._loop.run_in_executor(None, exposure.link.socket)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOCAL_HOST, port))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as error:
            sock.close()
            raise TaskError(
                f"cannot listen at {LOCAL_HOST}:{port} for {target.name} inside {exposure.link.name}: "
                f"{error.strerror}.",
                hint='another process holds that port (isolation "none").',
            ) from None

        exposure.servers[port] = await self._loop.create_server(
            lambda: _Pipe(self._pipes, lambda pipe: self._outbound(pipe, target)), sock=sock)

    async def _expose(self, exposure: Exposure) -> None:
        for port in exposure.routes:
            await self._listen_in(exposure, port)
        self._exposures.append(exposure)
        if exposure.watch:
            for port, target in exposure.routes.items():
                exposure.watchers.append(self._loop.create_task(self._watch(exposure, port, target)))

    async def _watch(self, exposure: Exposure, port: int, target: Target) -> None:
        while not exposure.closed:
            await asyncio.sleep(WATCH_PERIOD_S)
            up = await self._probe(target)
            if exposure.closed or target not in self._seen_up:
                continue  # a task still starting is not lost
            server = exposure.servers.get(port)
            try:
                if up and server is None:
                    await self._listen_in(exposure, port)
                elif not up and server is not None:
                    exposure.servers[port] = None
                    server.close()
            except (TaskError, ChildGone) as error:
                log.debug("watch of %s in %s: %s", target.name, exposure.link.name, error)
                return

    async def _close_exposure(self, exposure: Exposure) -> None:
        exposure.closed = True
        for watcher in exposure.watchers:
            watcher.cancel()
        for server in exposure.servers.values():
            if server is not None:
                server.close()
        exposure.servers = {port: None for port in exposure.servers}
        if exposure in self._exposures:
            self._exposures.remove(exposure)

    async def _stop_server(self, server: asyncio.AbstractServer) -> None:
        server.close()
        if server in self._servers:
            self._servers.remove(server)

    async def _shutdown(self) -> None:
        for exposure in list(self._exposures):
            await self._close_exposure(exposure)
        for server in self._servers:
            server.close()
        for pipe in list(self._pipes):
            if pipe.transport is not None:
                pipe.transport.abort()

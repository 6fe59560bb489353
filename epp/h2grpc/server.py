"""H2Server: the listening side, method routing and lifecycle, with the grpc.aio.Server calls Pointsman uses.

Methods are routed by path:
- native methods (`add_native_method`): a factory makes a callback-driven `StreamHandler` per call; no task, no
  queue (the ext_proc hot path, epp/extproc/h2.py);
- grpc.aio servicers, registered by the generated `add_*Servicer_to_server` functions (`add_generic_rpc_handlers`,
  `add_registered_method_handlers`): each call runs as a task with a grpc.aio-style context
  (epp/h2grpc/aio_adapter.py).

Ports are bound when added (as grpc does: `add_insecure_port` returns the port, 0 when it cannot bind) and served
from `start()`. `stop(grace)` stops accepting, sends GOAWAY, lets open calls finish for `grace` seconds, then
cancels what is left.

Limits (`ServerLimits`, limits.py) apply to every connection. The server keeps the connection cap: connections
without open streams are kept in the order they became idle, and at the cap the one idle the longest is closed to
make room for a new one (a client holding idle connections cannot lock others out); with none idle the new one
is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from epp.h2grpc.connection import Connection
from epp.h2grpc.limits import ServerLimits
from epp.h2grpc.stream import ServerStream, StreamHandler

log = logging.getLogger(__name__)

Factory = Callable[[ServerStream], StreamHandler]


@dataclass(frozen=True)
class _CallDetails:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


def split_address(addr: str) -> tuple[str | None, int]:
    """'host:port', '[v6]:port' or ':port' -> (host or None for every interface, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    host = host.strip("[]")
    return (host or None), int(port)


READ_BUFFER_BYTES = 256 * 1024  # one read from a socket at most (asyncio's own read size)

class H2Server:
    def __init__(self, *, max_message_bytes: int | None = None, reuse_port: bool = False,
                 limits: ServerLimits | None = None) -> None:
        """`limits`: every connection's (default `ServerLimits()`); `max_message_bytes` overrides its message limit."""
        limits = limits or ServerLimits()
        if max_message_bytes is not None:
            limits = dataclasses.replace(limits, max_message_bytes=max_message_bytes)
        self.limits = limits
        self.reuse_port = reuse_port
        self.connections: set[Connection] = set()
        self._idle: dict[Connection, None] = {}  # connections without open streams, longest idle first
        self.buffered = 0  # bytes all connections hold: messages being assembled, replies queued, requests unread
        # Every connection reads into this one buffer (connection.py): a read is handled before the next one starts.
        self.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self._inflater: concurrent.futures.ThreadPoolExecutor | None = None
        self._native: dict[str, Factory] = {}
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._routes: dict[str, Factory] = {}
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._servers: list[asyncio.Server] = []
        self._terminated: asyncio.Event | None = None

    @property
    def max_message_bytes(self) -> int:
        return self.limits.max_message_bytes

    def inflater(self) -> concurrent.futures.ThreadPoolExecutor:
        """The one thread compressed messages are inflated on (epp/h2grpc/inflate.py)."""
        if self._inflater is None:
            self._inflater = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grpc-inflate")
        return self._inflater

    # ---- connections ---------------------------------------------------------------------------------------
    def admit(self, conn: Connection) -> bool:
        """A new connection: room is made at the cap by closing the connection idle the longest."""
        if len(self.connections) >= self.limits.max_connections:
            if not self._idle:
                return False
            oldest = next(iter(self._idle))
            log.debug("at %d connections: closing the idle one from %s", len(self.connections), oldest.peer)
            self.connection_gone(oldest)
            oldest.close_idle()
        self.connections.add(conn)
        return True

    def connection_idle(self, conn: Connection) -> None:
        if conn in self.connections:
            self._idle[conn] = None

    def connection_busy(self, conn: Connection) -> None:
        self._idle.pop(conn, None)

    def connection_gone(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._idle.pop(conn, None)

    # ---- methods -------------------------------------------------------------------------------------------
    def add_native_method(self, path: str, factory: Factory) -> None:
        self._native[path] = factory
        self._routes.pop(path, None)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            path = f"/{service}/{name}"
            self._registered[path] = handler
            self._routes.pop(path, None)

    def route(self, path: str) -> Factory | None:
        factory = self._routes.get(path)
        if factory is not None:
            return factory
        factory = self._native.get(path)
        if factory is None:
            from epp.h2grpc.aio_adapter import aio_call_factory

            handler = self._registered.get(path)
            cacheable = handler is not None
            if handler is None:
                details = _CallDetails(path)
                for generic in self._generic:
                    handler = generic.service(details)
                    if handler is not None:
                        break
            if handler is None:
                return None
            factory = aio_call_factory(handler)
            if not cacheable:
                return factory
        self._routes[path] = factory
        return factory

    # ---- ports ---------------------------------------------------------------------------------------------
    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        return self._bind(address, context)

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        host, port = split_address(address)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as e:
            log.error("cannot resolve %s: %s", address, e)
            return 0
        bound: list[socket.socket] = []
        seen: set[tuple[int, object]] = set()
        try:
            for family, kind, proto, _, sockaddr in infos:
                if (family, sockaddr[0]) in seen:
                    continue
                seen.add((family, sockaddr[0]))
                sock = socket.socket(family, kind, proto)
                bound.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:  # '[::]' alone serves IPv4 too, as grpc's does
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host == "::" else 1)
                sock.bind((sockaddr[0], port, *sockaddr[2:]))
                if not port:  # every address gets the port the first one was given
                    port = sock.getsockname()[1]
                sock.setblocking(False)
        except OSError as e:
            log.error("cannot bind %s: %s", address, e)
            for sock in bound:
                sock.close()
            return 0
        self._sockets.extend((sock, context) for sock in bound)
        return port

    # ---- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._terminated = asyncio.Event()
        for sock, context in self._sockets:
            server = await loop.create_server(lambda: Connection(self), sock=sock, ssl=context, backlog=1024)
            self._servers.append(server)

    async def stop(self, grace: float | None) -> None:
        for server in self._servers:
            server.close()
        conns = list(self.connections)
        for conn in conns:
            conn.goaway()
        if grace:
            loop = asyncio.get_running_loop()
            end = loop.time() + grace
            while any(c.streams for c in conns) and loop.time() < end:
                await asyncio.sleep(0.02)
        for conn in conns:
            conn.cancel_all()
        self._servers.clear()
        self._sockets.clear()
        if self._inflater is not None:
            self._inflater.shutdown(wait=False, cancel_futures=True)
            self._inflater = None
        if self._terminated is not None:
            self._terminated.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._terminated is None:
            return True
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def server_ssl_context(key_pem: bytes, cert_pem: bytes) -> ssl.SSLContext:
    """A TLS server context for HTTP/2 (ALPN h2) from PEM bytes."""
    import os
    import tempfile

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
        cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert, "wb") as f:
            f.write(cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx

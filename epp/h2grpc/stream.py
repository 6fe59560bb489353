"""One gRPC call on an HTTP/2 stream: incoming bytes become messages for a handler; replies and status go out.

The handler is callback-driven (no task per stream): `on_message(data)` for every complete request message,
`on_end()` when the client half-closes, `on_cancel()` when the call dies without the handler finishing it (the
client reset the stream, the connection was lost, the deadline passed, a message broke a limit, or the server
stopped). The handler answers with `send(message)` / `send_many(messages)` and ends the call with
`finish(code, message)`; after finish or cancel nothing more is sent and no callback comes. After `on_end` the
stream is half-closed (remote): replies and the status may still follow, as late as the handler likes.

The stream's parts: its `MessageAssembly` (assembly.py) cuts the request body into messages without re-copying
and inflates compressed ones off the event loop, in order; replies go to the connection's `Outbound`
(outbound.py); what it holds counts in the connection's `ReceiveWindows` (windows.py). A handler that keeps request bytes unread (a queue) reports them
with `hold(n)` / `release(n)`, so that the stream's window is withheld while it keeps too many.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from epp.h2grpc import status
from epp.h2grpc.assembly import MessageAssembly

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection
    from epp.h2grpc.outbound import Outbound

log = logging.getLogger("epp.h2grpc.connection")

MAX_STATUS_MESSAGE = 1024  # characters of grpc-message; the rest is cut


class StreamHandler(Protocol):
    def on_message(self, data: bytes) -> None: ...
    def on_end(self) -> None: ...
    def on_cancel(self) -> None: ...


class ServerStream:
    __slots__ = ("conn", "out", "messages", "id", "path", "headers", "handler", "started", "finished", "closed",
                 "remote_ended", "pending", "pending_bytes", "trailers", "timer", "opened_at", "recv_window", "unacked",
                 "send_delta", "held", "reserved")

    def __init__(self, conn: Connection, out: Outbound, stream_id: int, path: str,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.conn = conn
        self.out = out  # where replies go (the connection's sending side)
        self.id = stream_id
        self.path = path
        self.headers = headers
        self.handler: StreamHandler | None = None
        self.started = False  # response headers sent
        self.finished = False  # trailers queued: the call is over for the handler
        self.closed = False  # reset, or the connection is gone: nothing can be sent
        self.remote_ended = False  # the client half-closed
        self.pending: deque[memoryview] | None = None  # framed data waiting for window or socket
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # an encoded trailer block waiting behind `pending`
        self.timer: asyncio.TimerHandle | None = None
        self.opened_at = 0.0
        self.recv_window = 0  # what the client may still send on this stream
        self.unacked = 0  # received and not yet given back with a WINDOW_UPDATE
        self.send_delta = 0  # our send window minus the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.held = 0  # request bytes the handler keeps unread (hold/release)
        self.reserved = 0  # bytes of the connection's buffer budget held for the message being assembled
        self.messages = MessageAssembly(conn.max_message_bytes)  # the request body, cut into messages

    # ---- what handlers use ---------------------------------------------------------------------------------
    @property
    def peer(self) -> str:
        return self.conn.peer

    def metadata(self) -> list[tuple[str, str]]:
        """Custom request metadata (no pseudo-headers, no transport headers), as grpc.aio reports it."""
        skip = (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding")
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers
                if not k.startswith(b":") and k not in skip]

    def send(self, message: bytes) -> None:
        if self.finished or self.closed:
            return
        self.out.send_data(self, status.frame(message))

    def send_many(self, messages: list[bytes]) -> None:
        if not messages or self.finished or self.closed:
            return
        pack = status.frame
        self.out.send_data(self, pack(messages[0]) if len(messages) == 1 else b"".join(map(pack, messages)))

    def send_parts(self, parts: list[bytes | memoryview]) -> None:
        """Messages already framed for gRPC (each with its 5-byte prefix), in pieces: written as they are, the
        pieces neither joined nor copied (a large piece is cut into DATA frames by slicing)."""
        if parts and not (self.finished or self.closed):
            self.out.send_parts(self, parts)

    def start(self, metadata: list[tuple[bytes, bytes]]) -> None:
        """Send the response headers now, with custom metadata (otherwise they go with the first message)."""
        if not (self.started or self.finished or self.closed):
            self.out.send_headers(self, metadata)

    def finish(self, code: int = status.OK, message: str = "",
               metadata: list[tuple[bytes, bytes]] | None = None) -> None:
        """End the call: trailers with grpc-status (and grpc-message), after any data still queued."""
        if self.finished or self.closed:
            return
        self.finished = True
        self.handler = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.messages.partial is not None or self.reserved:
            self.messages.drop_partial(self)
        self.out.send_trailers(self, code, message[:MAX_STATUS_MESSAGE], metadata)

    def hold(self, nbytes: int) -> None:
        """The handler keeps `nbytes` more of the request unread: they count against the stream's buffer bound."""
        if not self.closed:  # once closed, the stream's bytes have left the connection's count
            self.held += nbytes
            self.conn.windows.note_held(nbytes)

    def release(self, nbytes: int) -> None:
        """The handler consumed `nbytes` it held: the stream's window may open again."""
        if not self.closed:
            self.held -= nbytes
            windows = self.conn.windows
            windows.note_held(-nbytes)
            windows.window_may_open(self)

    async def writable(self, limit: int = 1 << 20) -> None:
        """Wait while more than `limit` bytes of replies wait on this stream's window or the socket is paused."""
        await self.out.writable(self, limit)

    # ---- what the connection calls ------------------------------------------------------------------------------
    def feed(self, data: bytes | memoryview) -> None:
        """Bytes of the request body (assembly.py cuts them into messages)."""
        self.messages.feed(self, data)

    def end(self) -> None:
        self.remote_ended = True
        if self.messages.end(self):
            handler = self.handler
            if handler is not None:
                handler.on_end()

    def fail(self, code: int, message: str) -> None:
        """End the call with an error status; the handler is told it was cancelled."""
        handler = self.handler
        self.finish(code, message)
        if handler is not None:
            handler.on_cancel()

    def handler_failed(self, error: Exception) -> None:
        """A handler's exception ends its call (INTERNAL), never the connection."""
        log.error("%s: handler failed", self.path, exc_info=error)
        try:
            self.fail(status.INTERNAL, f"handler failed: {error}")
        except Exception:
            log.exception("%s: the handler failed again while cancelling", self.path)

    def deadline_exceeded(self) -> None:
        self.timer = None
        self.fail(status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def lost(self) -> None:
        """Reset by the client, or the connection is gone (the connection has dropped the stream's buffers)."""
        self.closed = True
        self.pending = None
        self.trailers = None
        self.messages.partial = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        handler, self.handler = self.handler, None
        if handler is not None and not self.finished:
            handler.on_cancel()

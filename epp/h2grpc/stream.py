"""One gRPC call on an HTTP/2 stream: incoming bytes become messages for a handler; replies and status go out.

The handler is callback-driven (no task per stream): `on_message(data)` for every complete request message,
`on_end()` when the client half-closes, `on_cancel()` when the call dies without the handler finishing it (the
client reset the stream, the connection was lost, the deadline passed, a message broke a limit, or the server
stopped). The handler answers with `send(message)` / `send_many(messages)` and ends the call with
`finish(code, message)`; after finish or cancel nothing more is sent and no callback comes. After `on_end` the
stream is half-closed (remote): replies and the status may still follow, as late as the handler likes.

Messages are assembled without re-copying: one arriving whole in a DATA frame is a slice of it; one spread over
frames grows in one bytearray, handed on as it is. A compressed message is inflated off the event loop
(inflate.py); messages behind it wait, in order. A handler that keeps request bytes unread (a queue) reports them
with `hold(n)` / `release(n)`, so that the stream's window is withheld while it keeps too many.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Protocol

from epp.h2grpc import inflate, status

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection

MAX_STATUS_MESSAGE = 1024  # characters of grpc-message; the rest is cut


class StreamHandler(Protocol):
    def on_message(self, data: bytes) -> None: ...
    def on_end(self) -> None: ...
    def on_cancel(self) -> None: ...


class ServerStream:
    __slots__ = ("conn", "id", "path", "headers", "handler", "started", "finished", "closed", "remote_ended",
                 "pending", "pending_bytes", "trailers", "timer", "opened_at", "recv_window", "unacked",
                 "send_delta", "held", "reserved", "_partial", "_need", "_flag", "_inflating", "_backlog",
                 "_end_pending")

    def __init__(self, conn: Connection, stream_id: int, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        self.conn = conn
        self.id = stream_id
        self.path = path
        self.headers = headers
        self.handler: StreamHandler | None = None
        self.started = False  # response headers sent
        self.finished = False  # trailers queued: the call is over for the handler
        self.closed = False  # reset, or the connection is gone: nothing can be sent
        self.remote_ended = False  # the client half-closed
        self.pending: deque[bytes | memoryview] | None = None  # framed data waiting for window or socket
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # an encoded trailer block waiting behind `pending`
        self.timer: asyncio.TimerHandle | None = None
        self.opened_at = 0.0
        self.recv_window = 0  # what the client may still send on this stream
        self.unacked = 0  # received and not yet given back with a WINDOW_UPDATE
        self.send_delta = 0  # our send window minus the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.held = 0  # request bytes the handler keeps unread (hold/release)
        self.reserved = 0  # bytes of the connection's buffer budget held for the message being assembled
        self._partial: bytearray | None = None  # the message being assembled (its 5-byte prefix while incomplete)
        self._need = -1  # bytes still missing from it; -1 while its prefix is incomplete
        self._flag = 0
        self._inflating: int | None = None  # the size of a compressed message being inflated (inflate.Queue)
        self._backlog: list[bytes] = []  # request bytes that arrived meanwhile (held: they count against the window)
        self._end_pending = False  # the client half-closed meanwhile

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
        self.conn.send_data(self, status.frame(message))

    def send_many(self, messages: list[bytes]) -> None:
        if not messages or self.finished or self.closed:
            return
        pack = status.frame
        self.conn.send_data(self, pack(messages[0]) if len(messages) == 1 else b"".join(map(pack, messages)))

    def start(self, metadata: list[tuple[bytes, bytes]]) -> None:
        """Send the response headers now, with custom metadata (otherwise they go with the first message)."""
        if not (self.started or self.finished or self.closed):
            self.conn.send_headers(self, metadata)

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
        self._drop_partial()
        self.conn.send_trailers(self, code, message[:MAX_STATUS_MESSAGE], metadata)

    def hold(self, nbytes: int) -> None:
        """The handler keeps `nbytes` more of the request unread: they count against the stream's buffer bound."""
        if not self.closed:  # once closed, the stream's bytes have left the connection's count
            self.held += nbytes
            self.conn.note_held(nbytes)

    def release(self, nbytes: int) -> None:
        """The handler consumed `nbytes` it held: the stream's window may open again."""
        if not self.closed:
            self.held -= nbytes
            self.conn.note_held(-nbytes)
            self.conn.window_may_open(self)

    # ---- what the connection calls ---------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes of the request body: split into messages for the handler."""
        if self._inflating is not None:  # later messages wait for the compressed one before them
            self._backlog.append(data)
            self.hold(len(data))
            return
        if self._partial is not None:
            rest = self._continue(data)
            if rest is None:
                return
            if self._inflating is not None:
                self.feed(rest)
                return
            data = rest
        limit = self.conn.max_message_bytes
        pos, end = 0, len(data)
        while self.handler is not None and pos < end:
            if end - pos < 5:
                self._partial = bytearray(data[pos:])
                self._need = -1
                return
            size = int.from_bytes(data[pos + 1: pos + 5], "big")
            if size > limit:
                self._too_large(size, limit)
                return
            stop = pos + 5 + size
            if stop > end:
                if self._reserve(size):
                    self._flag = data[pos]
                    self._partial = bytearray(memoryview(data)[pos + 5:])
                    self._need = stop - end
                return
            flag = data[pos]
            message = data[pos + 5: stop]
            pos = stop
            self._deliver(flag, message)
            if self._inflating is not None and pos < end:
                self.feed(data[pos:])
                return

    def _continue(self, data: bytes) -> bytes | None:
        """Grow the message being assembled; deliver it when whole. The rest of `data`, or None (used up)."""
        buf = self._partial
        assert buf is not None
        pos = 0
        if self._need < 0:  # its 5-byte prefix is still incomplete
            pos = min(5 - len(buf), len(data))
            buf += data[:pos]
            if len(buf) < 5:
                return None
            size = int.from_bytes(buf[1:5], "big")
            limit = self.conn.max_message_bytes
            self._partial = None
            if size > limit:
                self._too_large(size, limit)
                return None
            if not self._reserve(size):
                return None
            self._flag = buf[0]
            self._partial = buf = bytearray()
            self._need = size
        take = min(self._need, len(data) - pos)
        if take:
            buf += memoryview(data)[pos: pos + take]
            pos += take
            self._need -= take
        if self._need:
            return None
        self._partial = None
        self._need = -1
        self.conn.unreserve(self)
        if self.handler is not None:
            self._deliver(self._flag, buf)  # type: ignore[arg-type]  # a bytearray: handlers read it as bytes
        return data[pos:] if pos < len(data) else None

    def _reserve(self, size: int) -> bool:
        if self.conn.reserve(self, size):
            return True
        self.fail(status.RESOURCE_EXHAUSTED, "the connection's buffer budget is exhausted")
        return False

    def _too_large(self, size: int, limit: int) -> None:
        self.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")

    def _drop_partial(self) -> None:
        self._partial = None
        self._need = -1
        if self.reserved:
            self.conn.unreserve(self)

    def _deliver(self, flag: int, message: bytes) -> None:
        if flag:
            self._inflate(message)
            return
        handler = self.handler
        if handler is not None:
            handler.on_message(message)

    def _inflate(self, message: bytes) -> None:
        """Queue a compressed message for inflating; what follows on this stream waits for it (`_inflated`)."""
        encoding = next((v for k, v in self.headers if k == b"grpc-encoding"), b"identity")
        wbits = inflate.WBITS.get(encoding)
        if wbits is None:  # the client's value is not repeated in the reply
            self.fail(status.UNIMPLEMENTED, "a compressed message in an unsupported grpc-encoding: only gzip and "
                                            "deflate are supported")
            return
        self._inflating = len(message)
        self.hold(len(message))
        self.conn.inflations.add(self._inflated, message, wbits)

    def _inflated(self, result: bytes | Exception) -> None:
        held, self._inflating = self._inflating, None
        backlog, self._backlog = self._backlog, []
        if self.handler is None or self.closed:
            return  # the call ended meanwhile (its held bytes left with it)
        assert held is not None
        self.release(held)
        if isinstance(result, inflate.TooLarge):
            limit = self.conn.max_message_bytes
            self.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max (over {limit} once decompressed)")
            return
        if isinstance(result, Exception):
            self.fail(status.INTERNAL, "could not decompress the message")
            return
        try:
            self.handler.on_message(result)
            for i, data in enumerate(backlog):
                self.release(len(data))
                self.feed(data)
                if self._inflating is not None:  # another compressed message: the rest waits again
                    self._backlog += backlog[i + 1:]
                    return
            if self._end_pending:
                self._end_pending = False
                self.end()
        except Exception as e:  # a handler bug ends its call, never the connection
            self.conn.handler_failed(self, e)

    def end(self) -> None:
        self.remote_ended = True
        if self._inflating is not None:
            self._end_pending = True
            return
        handler = self.handler
        if handler is None:
            return
        if self._partial is not None:
            self.fail(status.INTERNAL, "the request ended inside a message")
            return
        handler.on_end()

    def fail(self, code: int, message: str) -> None:
        """End the call with an error status; the handler is told it was cancelled."""
        handler = self.handler
        self.finish(code, message)
        if handler is not None:
            handler.on_cancel()

    def deadline_exceeded(self) -> None:
        self.timer = None
        self.fail(status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def lost(self) -> None:
        """Reset by the client, or the connection is gone (the connection has dropped the stream's buffers)."""
        self.closed = True
        self.pending = None
        self.trailers = None
        self._partial = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        handler, self.handler = self.handler, None
        if handler is not None and not self.finished:
            handler.on_cancel()

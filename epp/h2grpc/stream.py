"""One gRPC call on an HTTP/2 stream: incoming bytes become messages for a handler; replies and status go out.

The handler is callback-driven (no task per stream): `on_message(data)` for every complete request message,
`on_end()` when the client half-closes, `on_cancel()` when the call dies without the handler finishing it (the
client reset the stream, the connection was lost, the deadline passed, a message broke a limit, or the server
stopped). The handler answers with `send(message)` / `send_many(messages)` and ends the call with
`finish(code, message)`; after finish or cancel nothing more is sent and no callback comes.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Protocol

from epp.h2grpc import status

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection


class StreamHandler(Protocol):
    def on_message(self, data: bytes) -> None: ...
    def on_end(self) -> None: ...
    def on_cancel(self) -> None: ...


class ServerStream:
    __slots__ = ("conn", "id", "path", "headers", "handler", "started", "finished", "closed", "remote_ended",
                 "pending", "trailers", "timer", "_buf")

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
        self.pending: list[bytes | memoryview] | None = None  # framed data waiting for flow-control window
        self.trailers: list[tuple[bytes, bytes]] | None = None  # waiting behind `pending`
        self.timer: asyncio.TimerHandle | None = None
        self._buf = b""

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
        trailers = [(b"grpc-status", b"%d" % code)]
        if message:
            trailers.append((b"grpc-message", status.encode_grpc_message(message)))
        if metadata:
            trailers += metadata
        self.conn.send_trailers(self, trailers)

    # ---- what the connection calls ---------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes of the request body: split into messages for the handler."""
        buf = self._buf + data if self._buf else data
        limit = self.conn.server.max_message_bytes
        pos, end = 0, len(buf)
        while end - pos >= 5 and self.handler is not None:
            flag = buf[pos]
            size = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if size > limit:
                self.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")
                return
            stop = pos + 5 + size
            if stop > end:
                break
            message = buf[pos + 5 : stop]
            pos = stop
            if flag:
                inflated = self._inflate(message, limit)
                if inflated is None:
                    return
                message = inflated
            self.handler.on_message(message)
        self._buf = buf[pos:] if pos < end and self.handler is not None else b""

    def _inflate(self, message: bytes, limit: int) -> bytes | None:
        """A compressed message (flag 1) in the call's `grpc-encoding`: gzip or deflate, as grpc clients send them
        (`compression=grpc.Compression.Gzip`). None after failing the call: an unknown encoding, a broken stream, or
        more than `limit` bytes once inflated."""
        encoding = next((v for k, v in self.headers if k == b"grpc-encoding"), b"identity")
        if encoding == b"gzip":
            wbits = 16 + zlib.MAX_WBITS
        elif encoding == b"deflate":
            wbits = zlib.MAX_WBITS
        else:
            self.fail(status.UNIMPLEMENTED, f"compressed message with grpc-encoding "
                                            f"{encoding.decode('latin-1')!r}: only gzip and deflate are supported")
            return None
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(message, limit + 1)
        except zlib.error as e:
            self.fail(status.INTERNAL, f"could not decompress a {encoding.decode()} message: {e}")
            return None
        if len(out) > limit or inflater.unconsumed_tail:
            self.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max (over {limit} once decompressed)")
            return None
        return out

    def end(self) -> None:
        self.remote_ended = True
        handler = self.handler
        if handler is None:
            return
        if self._buf:
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
        """Reset by the client, or the connection is gone."""
        self.closed = True
        self.pending = None
        self.trailers = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        handler, self.handler = self.handler, None
        if handler is not None and not self.finished:
            handler.on_cancel()

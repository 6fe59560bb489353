"""Request messages from a stream's DATA: copied once, inflated off the loop, handed on in order.

DATA payloads are views of the connection's read buffer, which the next read overwrites, so every byte a message
keeps is copied out of them, once: a message arriving whole in a DATA frame becomes bytes; one spread over frames
is copied into one bytearray allocated at its full size once its 5-byte prefix has arrived (that size reserved
against the connection's buffer budget first, so a claimed size is never allocated past the budget), handed on as it
is: growing it frame by frame instead had realloc move it again and again (a 256 KB message in 16 KB frames cost
about as much copying as the rest of its path). A compressed message is inflated off
the event loop (inflate.py); messages behind it wait, in order, and count as held against the stream's window.
Each `ServerStream` (stream.py) owns one `MessageAssembly` and passes itself in: complete messages go to its handler,
and what goes wrong is reported through it (`fail`, `hold`/`release`, `handler_failed`). The assembly keeps no
reference to its stream, so a finished stream is freed at once rather than left to the cycle collector.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from epp.h2grpc import inflate, status

if TYPE_CHECKING:
    from epp.h2grpc.stream import ServerStream


class MessageAssembly:
    __slots__ = ("limit", "partial", "_need", "_flag", "inflating", "_backlog", "_end_pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit  # the largest message, in bytes (inflated)
        self.partial: bytearray | None = None  # the message being assembled (its 5-byte prefix while incomplete)
        # bytes still missing from it; -1 while its prefix is incomplete. Once the prefix is in, the message is
        # allocated whole and its first len(partial) - _need bytes have arrived (filled in place, never grown)
        self._need = -1
        self._flag = 0
        self.inflating: int | None = None  # the size of a compressed message being inflated (inflate.Queue)
        self._backlog: list[bytes] = []  # request bytes that arrived meanwhile (held: they count against the window)
        self._end_pending = False  # the client half-closed meanwhile

    def feed(self, stream: ServerStream, data: bytes | memoryview) -> None:
        """Bytes of the request body (a DATA frame's payload, a view of the read it came in): split into messages
        for the stream's handler. Each message is copied once, out of the reads, into a buffer of its own."""
        if self.inflating is not None:  # later messages wait for the compressed one before them
            data = bytes(data)
            self._backlog.append(data)
            stream.hold(len(data))
            return
        if self.partial is not None:
            rest = self._continue(stream, data)
            if rest is None:
                return
            if self.inflating is not None:
                self.feed(stream, rest)
                return
            data = rest
        limit = self.limit
        pos, end = 0, len(data)
        while stream.handler is not None and pos < end:
            if end - pos < 5:
                self.partial = bytearray(data[pos:])
                self._need = -1
                return
            size = int.from_bytes(data[pos + 1: pos + 5], "big")
            if size > limit:
                self._too_large(stream, size)
                return
            stop = pos + 5 + size
            if stop > end:
                if self._reserve(stream, size):
                    self._flag = data[pos]
                    self.partial = buf = bytearray(size)  # within the reservation: filled, never grown
                    buf[: end - pos - 5] = memoryview(data)[pos + 5:]
                    self._need = stop - end
                return
            flag = data[pos]
            message = bytes(data[pos + 5: stop])
            pos = stop
            if flag:
                self._inflate(stream, message)
                if self.inflating is not None:
                    if pos < end:
                        self.feed(stream, data[pos:])
                    return
                continue
            handler = stream.handler
            if handler is not None:
                handler.on_message(message)

    def _continue(self, stream: ServerStream, data: bytes | memoryview) -> bytes | memoryview | None:
        """Grow the message being assembled; deliver it when whole. The rest of `data`, or None (used up)."""
        buf = self.partial
        assert buf is not None
        pos = 0
        if self._need < 0:  # its 5-byte prefix is still incomplete
            pos = min(5 - len(buf), len(data))
            buf += data[:pos]
            if len(buf) < 5:
                return None
            size = int.from_bytes(buf[1:5], "big")
            self.partial = None
            if size > self.limit:
                self._too_large(stream, size)
                return None
            if not self._reserve(stream, size):
                return None
            self._flag = buf[0]
            self.partial = buf = bytearray(size)
            self._need = size
        take = min(self._need, len(data) - pos)
        if take:
            fill = len(buf) - self._need
            buf[fill: fill + take] = memoryview(data)[pos: pos + take]  # a copy into place: the size never changes
            pos += take
            self._need -= take
        if self._need:
            return None
        self.partial = None
        self._need = -1
        stream.conn.windows.unreserve(stream)
        if stream.handler is not None:
            self._deliver(stream, self._flag, buf)  # type: ignore[arg-type]  # a bytearray: handlers read it as bytes
        return data[pos:] if pos < len(data) else None

    def _reserve(self, stream: ServerStream, size: int) -> bool:
        if stream.conn.windows.reserve(stream, size):
            return True
        stream.fail(status.RESOURCE_EXHAUSTED, "the connection's buffer budget is exhausted")
        return False

    def _too_large(self, stream: ServerStream, size: int) -> None:
        stream.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {self.limit})")

    def drop_partial(self, stream: ServerStream) -> None:
        """The call ended: the message being assembled is dropped, its reservation given back."""
        self.partial = None
        self._need = -1
        if stream.reserved:
            stream.conn.windows.unreserve(stream)

    def end(self, stream: ServerStream) -> bool:
        """The client half-closed: True when the handler may be told now (every message handed on)."""
        if self.inflating is not None:
            self._end_pending = True
            return False
        if self.partial is not None and stream.handler is not None:
            stream.fail(status.INTERNAL, "the request ended inside a message")
            return False
        return True

    def _deliver(self, stream: ServerStream, flag: int, message: bytes) -> None:
        if flag:
            self._inflate(stream, message)
            return
        handler = stream.handler
        if handler is not None:
            handler.on_message(message)

    def _inflate(self, stream: ServerStream, message: bytes) -> None:
        """Queue a compressed message for inflating; what follows on this stream waits for it (`_inflated`)."""
        encoding = next((v for k, v in stream.headers if k == b"grpc-encoding"), b"identity")
        wbits = inflate.WBITS.get(encoding)
        if wbits is None:  # the client's value is not repeated in the reply
            stream.fail(status.UNIMPLEMENTED, "a compressed message in an unsupported grpc-encoding: only gzip and "
                                              "deflate are supported")
            return
        self.inflating = len(message)
        stream.hold(len(message))
        stream.conn.inflations.add(partial(self._inflated, stream), message, wbits)

    def _inflated(self, stream: ServerStream, result: bytes | Exception) -> None:
        held, self.inflating = self.inflating, None
        backlog, self._backlog = self._backlog, []
        if stream.handler is None or stream.closed:
            return  # the call ended meanwhile (its held bytes left with it)
        assert held is not None
        stream.release(held)
        if isinstance(result, inflate.TooLarge):
            stream.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max (over {self.limit} once "
                                                   "decompressed)")
            return
        if isinstance(result, Exception):
            stream.fail(status.INTERNAL, "could not decompress the message")
            return
        try:
            stream.handler.on_message(result)
            for i, data in enumerate(backlog):
                stream.release(len(data))
                self.feed(stream, data)
                if self.inflating is not None:  # another compressed message: the rest waits again
                    self._backlog += backlog[i + 1:]
                    return
            if self._end_pending:
                self._end_pending = False
                stream.end()
        except Exception as e:  # a handler bug ends its call, never the connection
            stream.handler_failed(e)

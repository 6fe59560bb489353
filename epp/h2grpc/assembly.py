"""Request messages from a stream's DATA: assembled without re-copying, inflated off the loop, handed on in order.

A message arriving whole in a DATA frame is a slice of it; one spread over frames grows in one bytearray (its size
reserved against the connection's buffer budget first), handed on as it is. A compressed message is inflated off
the event loop (inflate.py); messages behind it wait, in order, and count as held against the stream's window.
`ServerStream` (stream.py) is the one class that mixes this in; its slots hold the state used here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from epp.h2grpc import inflate, status

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection
    from epp.h2grpc.stream import ServerStream, StreamHandler


class MessageAssembly:
    __slots__ = ("_partial", "_need", "_flag", "_inflating", "_backlog", "_end_pending")
    # What it reads of the stream (ServerStream's slots).
    conn: Connection
    headers: list[tuple[bytes, bytes]]
    handler: StreamHandler | None
    closed: bool
    reserved: int

    def _me(self) -> ServerStream:
        return cast("ServerStream", self)

    def _init_assembly(self) -> None:
        self._partial: bytearray | None = None  # the message being assembled (its 5-byte prefix while incomplete)
        self._need = -1  # bytes still missing from it; -1 while its prefix is incomplete
        self._flag = 0
        self._inflating: int | None = None  # the size of a compressed message being inflated (inflate.Queue)
        self._backlog: list[bytes] = []  # request bytes that arrived meanwhile (held: they count against the window)
        self._end_pending = False  # the client half-closed meanwhile

    def hold(self, nbytes: int) -> None: ...
    def release(self, nbytes: int) -> None: ...
    def fail(self, code: int, message: str) -> None: ...
    def end(self) -> None: ...

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
        self.conn.unreserve(self._me())
        if self.handler is not None:
            self._deliver(self._flag, buf)  # type: ignore[arg-type]  # a bytearray: handlers read it as bytes
        return data[pos:] if pos < len(data) else None

    def _reserve(self, size: int) -> bool:
        if self.conn.reserve(self._me(), size):
            return True
        self.fail(status.RESOURCE_EXHAUSTED, "the connection's buffer budget is exhausted")
        return False

    def _too_large(self, size: int, limit: int) -> None:
        self.fail(status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")

    def _drop_partial(self) -> None:
        self._partial = None
        self._need = -1
        if self.reserved:
            self.conn.unreserve(self._me())

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
            self.conn.handler_failed(self._me(), e)

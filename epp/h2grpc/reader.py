"""The inbound byte stream of one connection, cut into HTTP/2 frames.

- The client preface is checked byte by byte as it arrives, then its first frame must be SETTINGS.
- A frame's length is checked on its 9-byte header, before any of its payload is buffered: a frame longer than
  the SETTINGS_MAX_FRAME_SIZE we advertised ends the connection (FRAME_SIZE_ERROR) at once.
- A read is handed over as a view of the server's read buffer, which the next read overwrites: nothing here keeps
  a view of it. A DATA frame's payload is passed on as a view (the stream's message assembly copies the bytes
  once, into the message they belong to, before the read ends); the other frames' payloads are bytes. Only a
  frame split across reads is buffered, in one bytearray that grows to that frame's length and no further, and
  is completed from the next read without copying the rest of it.
- While a header block is open (HEADERS without END_HEADERS), anything but a CONTINUATION of the same stream is
  a connection error (RFC 9113 §6.10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from epp.h2grpc.frames import (
    CONTINUATION,
    DATA,
    FRAME_SIZE_ERROR,
    HEADER,
    PREFACE,
    PROTOCOL_ERROR,
    SETTINGS,
    H2Error,
)

Handler = Callable[[int, int, bytes], None]  # (flags, stream id, payload)


class FrameReader:
    __slots__ = ("max_frame", "handlers", "ignore", "continuation", "stopped", "_preface", "_first", "_buf",
                 "_want")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.handlers: Sequence[Handler] = ()  # by frame type (`dispatch_to`)
        self.ignore: Handler | None = None  # unknown types (RFC 9113 §4.1: ignored)
        self.continuation = 0  # the stream whose header block is open, else 0
        self.stopped = False  # set by the connection when it ends: the rest of the read is dropped
        self._preface = 0  # bytes of the preface received
        self._first = True  # the first frame must be SETTINGS
        self._buf: bytearray | None = None  # a frame split across reads
        self._want = 0  # its whole length (header + payload), once its header is complete

    def dispatch_to(self, handlers: Sequence[Handler], ignore: Handler) -> None:
        """Where frames go: `handlers[type]` for the ten types of RFC 9113, `ignore` for the others."""
        self.handlers = handlers
        self.ignore = ignore

    @property
    def handshaking(self) -> bool:
        return self._first

    def feed(self, data: bytes | memoryview) -> None:
        """Handle every complete frame in `data`; raises H2Error on a connection error."""
        pos = 0
        if self._preface < len(PREFACE):
            pos = self._check_preface(data)
            if pos < 0:
                return
        if self._buf is not None:
            pos = self._complete(data, pos)
            if pos < 0 or self.stopped:
                return
        self._frames(data, pos)

    def _check_preface(self, data: bytes | memoryview) -> int:
        have = self._preface
        take = min(len(PREFACE) - have, len(data))
        if data[:take] != PREFACE[have: have + take]:
            raise H2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        self._preface += take
        return take if self._preface == len(PREFACE) else -1

    def _complete(self, data: bytes | memoryview, pos: int) -> int:
        """Add to the split frame; handle it once whole. The position in `data` after it, or -1 (data used up)."""
        buf = self._buf
        assert buf is not None
        if len(buf) < 9:
            take = min(9 - len(buf), len(data) - pos)
            buf += data[pos: pos + take]
            pos += take
            if len(buf) < 9:
                return -1
            self._want = 9 + self._length(buf, 0)
        take = min(self._want - len(buf), len(data) - pos)
        if take:
            buf += memoryview(data)[pos: pos + take]
            pos += take
        if len(buf) < self._want:
            return -1
        self._buf = None
        self._frames(buf if buf[3] == DATA else bytes(buf), 0)
        return pos

    def _length(self, data: bytes | bytearray | memoryview, pos: int) -> int:
        hi, lo, ftype, _, _ = HEADER.unpack_from(data, pos)
        length: int = hi << 8 | lo
        if length > self.max_frame:
            raise H2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes (the limit is {self.max_frame})")
        return length

    def _frames(self, data: bytes | bytearray | memoryview, pos: int) -> None:
        end = len(data)
        view = memoryview(data)
        unpack = HEADER.unpack_from
        handlers = self.handlers
        max_frame = self.max_frame
        while end - pos >= 9:
            hi, lo, ftype, flags, sid = unpack(data, pos)
            length = hi << 8 | lo
            if length > max_frame:
                raise H2Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes (the limit is {max_frame})")
            start = pos + 9
            stop = start + length
            if stop > end:
                break
            pos = stop
            sid &= 0x7FFFFFFF
            if self.continuation and (ftype != CONTINUATION or sid != self.continuation):
                raise H2Error(PROTOCOL_ERROR, "a header block was interrupted")
            if self._first:
                if ftype != SETTINGS or flags & 1:
                    raise H2Error(PROTOCOL_ERROR, "the connection preface must be followed by SETTINGS")
                self._first = False
            if ftype == DATA:
                handlers[DATA](flags, sid, view[start:stop])  # type: ignore[arg-type]  # handled as bytes
            elif ftype < 10:
                handlers[ftype](flags, sid, bytes(data[start:stop]))
            elif self.ignore is not None:
                self.ignore(flags, sid, bytes(data[start:stop]))
            if self.stopped:
                return
        if pos < end:
            self._buf = bytearray(data[pos:])
            self._want = 9 + self._length(self._buf, 0) if end - pos >= 9 else 0

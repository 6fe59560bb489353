"""The frames a client sends on its streams (RFC 9113 §6.1-6.4, §6.10, the server's side).

DATA, HEADERS (with CONTINUATION: `HeaderAssembly`, headers.py) and the stream-level PRIORITY and RST_STREAM; the
connection-scoped frames are `Control`'s (control.py), what a stream's frames do to the table of open streams is
`StreamTable`'s (streamtable.py), the receive windows `ReceiveWindows`' (windows.py). Every handler is O(1) in the
number of open streams. A connection error raises H2Error (the connection sends GOAWAY with its code); a stream
error resets the stream and counts against the premature-reset budget; floods spend their budgets (budget.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from epp.h2grpc.frames import (
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    STREAM_CLOSED,
    H2Error,
)

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.headers import HeaderAssembly
    from epp.h2grpc.limits import ServerLimits
    from epp.h2grpc.reader import FrameReader
    from epp.h2grpc.streamtable import StreamTable
    from epp.h2grpc.windows import ReceiveWindows


class Inbound:
    __slots__ = ("reader", "table", "streams", "windows", "blocks", "budget", "limits", "loop")

    def __init__(self, reader: FrameReader, table: StreamTable, windows: ReceiveWindows, blocks: HeaderAssembly,
                 budget: Budget, limits: ServerLimits, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = reader  # told while a header block is open: nothing but its CONTINUATION may come
        self.table = table
        self.streams = table.streams  # the table's open streams, looked up (never changed) here
        self.windows = windows
        self.blocks = blocks
        self.budget = budget
        self.limits = limits
        self.loop = loop

    def on_data(self, flags: int, sid: int, payload: bytes | memoryview) -> None:
        n = len(payload)
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if flags & PADDED:
            if n == 0 or payload[0] >= n:
                raise H2Error(PROTOCOL_ERROR, "DATA padding longer than the frame")
            payload = payload[1: n - payload[0]]
        self.windows.received(n)
        end = flags & END_STREAM
        if payload or end:
            self.budget.empty_run = 0
        elif why := self.budget.empty_frame():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        stream = self.streams.get(sid)
        if stream is None:
            table = self.table
            if sid > table.last_stream:
                raise H2Error(PROTOCOL_ERROR, "DATA on an idle stream")
            if not table.was_reset(sid):
                raise H2Error(STREAM_CLOSED, "DATA on a closed stream")
            return  # in flight when we reset the stream; its bytes are given back with the connection's
        if stream.remote_ended:
            self.table.stream_error(stream, STREAM_CLOSED)
            return
        stream.recv_window -= n
        if stream.recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "a stream's window was overrun")
        if payload and stream.handler is not None:
            try:
                stream.feed(payload)
            except Exception as e:  # a handler bug ends its call, never the connection
                stream.handler_failed(e)
        if end:
            self.table.end_stream(stream)
        elif n and not stream.closed:
            stream.unacked += n
            self.windows.window_may_open(stream)

    def on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "HEADERS on stream 0")
        start, stop = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise H2Error(FRAME_SIZE_ERROR, "a padded HEADERS frame without its pad length")
            start, stop = 1, stop - payload[0]
        self_dependent = False
        if flags & PRIORITY_FLAG:
            if stop - start < 5:
                raise H2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            self_dependent = int.from_bytes(payload[start: start + 4], "big") & 0x7FFFFFFF == sid
            start += 5
        if stop < start:
            raise H2Error(PROTOCOL_ERROR, "HEADERS padding longer than the frame")
        block = payload[start:stop] if start or stop < len(payload) else payload
        if block or flags & END_STREAM:
            self.budget.empty_run = 0
        elif why := self.budget.empty_frame():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        blocks = self.blocks
        blocks.check_size(block)
        if flags & END_HEADERS:
            self.table.headers(sid, flags, blocks.decode(block), self_dependent)
            return
        blocks.begin(sid, flags, block, self_dependent)
        self.reader.continuation = sid

    def on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        done = self.blocks.continuation(flags, sid, payload)
        if done is not None:
            self.reader.continuation = 0
            flags, block, self_dependent = done
            self.table.headers(sid, flags, self.blocks.decode(block), self_dependent)

    def on_priority(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if why := self.budget.priority():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        bad = FRAME_SIZE_ERROR if len(payload) != 5 else (
            PROTOCOL_ERROR if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == sid else NO_ERROR)
        if bad:  # a stream error (RFC 9113 §6.3); the priority itself is ignored, as RFC 9113 allows
            stream = self.streams.get(sid)
            if stream is None:
                raise H2Error(bad, "a malformed PRIORITY frame")
            self.table.stream_error(stream, bad)

    def on_rst_stream(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "RST_STREAM of a wrong length")
        if sid == 0 or sid > self.table.last_stream:
            raise H2Error(PROTOCOL_ERROR, "RST_STREAM on stream 0 or an idle stream")
        stream = self.streams.get(sid)
        if stream is None:
            return
        premature = not stream.started and self.loop.time() - stream.opened_at < self.limits.premature_reset_seconds
        self.table.forget(stream)
        if premature:
            self.table.premature()

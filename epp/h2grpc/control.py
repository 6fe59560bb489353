"""The connection-scoped frames a client sends (RFC 9113 §6.5-6.9, the server's side).

SETTINGS, PING, GOAWAY and WINDOW_UPDATE (for the connection or one stream), and the frames a client may not send
or that we ignore. SETTINGS and PING spend the control-frame budget, WINDOW_UPDATE its own (budget.py); the
windows and settings they change are the sending side's (`Outbound`, outbound.py), where a window that opens
visits only the streams waiting for it and a change of SETTINGS_INITIAL_WINDOW_SIZE is O(1) per stream. What they
mean for the connection's life (the handshake done, our GOAWAY seen, the client's GOAWAY) goes to its `Lifecycle`.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Protocol

from epp.h2grpc import frames
from epp.h2grpc.frames import (
    ACK,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    H2Error,
)

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.outbound import Outbound
    from epp.h2grpc.streamtable import StreamTable

_SETTING = struct.Struct(">HI")


class Lifecycle(Protocol):
    """What the connection hears from its control frames."""

    def settled(self) -> None: ...  # the client's first SETTINGS arrived: the handshake is done
    def ping_acked(self, payload: bytes) -> None: ...  # a PING of ours was answered
    def client_goaway(self, code: int) -> None: ...  # the client opens no more streams


class Control:
    __slots__ = ("life", "out", "table", "budget", "loop")

    def __init__(self, life: Lifecycle, out: Outbound, table: StreamTable, budget: Budget,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.life = life
        self.out = out
        self.table = table
        self.budget = budget
        self.loop = loop

    def on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2Error(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2Error(FRAME_SIZE_ERROR, "SETTINGS of a wrong length")
        if why := self.budget.control_frame(self.loop.time()):
            raise H2Error(ENHANCE_YOUR_CALM, why)
        out = self.out
        initial = out.peer_initial
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == frames.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                initial = value
            elif key == frames.MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise H2Error(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                out.max_frame = value
            elif key == frames.ENABLE_PUSH and value > 1:
                raise H2Error(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH out of range")
            # HEADER_TABLE_SIZE: we never index (frames.py); MAX_CONCURRENT_STREAMS: we push nothing;
            # MAX_HEADER_LIST_SIZE: our header blocks are a few fields of our own
        out.send_frame(frames.SETTINGS_ACK)
        self.life.settled()
        if initial != out.peer_initial:
            out.initial_window(initial)

    def on_push_promise(self, flags: int, sid: int, payload: bytes) -> None:
        raise H2Error(PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise H2Error(FRAME_SIZE_ERROR, "PING of a wrong length")
        if sid:
            raise H2Error(PROTOCOL_ERROR, "PING on a stream")
        if flags & ACK:
            self.life.ping_acked(payload)
            return
        if why := self.budget.control_frame(self.loop.time()):
            raise H2Error(ENHANCE_YOUR_CALM, why)
        self.out.send_frame(frames.ping(payload, ack=True))

    def on_goaway(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2Error(FRAME_SIZE_ERROR, "GOAWAY too short")
        self.life.client_goaway(int.from_bytes(payload[4:8], "big"))

    def on_window_update(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong length")
        if why := self.budget.window_update():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if not increment:
                raise H2Error(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.out.window_update(increment)
            return
        table = self.table
        stream = table.streams.get(sid)
        if stream is None:
            if sid > table.last_stream:
                raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if not increment:
            table.stream_error(stream, PROTOCOL_ERROR)
        elif not self.out.stream_window_update(stream, increment):
            table.stream_error(stream, FLOW_CONTROL_ERROR)

    def on_unknown(self, flags: int, sid: int, payload: bytes) -> None:
        pass  # RFC 9113 §4.1: frames of unknown types are ignored

"""The connection-scoped frames a client sends (RFC 9113 §6.5-6.9, the server's side): mixed into Connection.

SETTINGS, PING, GOAWAY and WINDOW_UPDATE (for the connection or one stream), and the frames a client may not send
or that we ignore. SETTINGS and PING spend the control-frame budget, WINDOW_UPDATE its own (budget.py); a window
that opens visits only the streams waiting for it (outbound.py), and a change of SETTINGS_INITIAL_WINDOW_SIZE is
O(1) per stream.
"""

from __future__ import annotations

import asyncio
import struct

from epp.h2grpc import frames
from epp.h2grpc.frames import (
    ACK,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PROTOCOL_ERROR,
    H2Error,
)
from epp.h2grpc.streamtable import StreamTable

_SETTING = struct.Struct(">HI")


class Control(StreamTable):
    # set up by Connection.__init__ (besides what StreamTable declares)
    going_away: bool
    last_stream: int
    _announced: bool
    _timers: dict[str, asyncio.TimerHandle]

    def _final_goaway(self) -> None:  # Connection
        raise NotImplementedError

    def _close(self) -> None:  # Connection
        raise NotImplementedError

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
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
        initial = self._peer_initial
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == frames.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                initial = value
            elif key == frames.MAX_FRAME_SIZE:
                if not 16384 <= value <= (1 << 24) - 1:
                    raise H2Error(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._max_out_frame = value
            elif key == frames.ENABLE_PUSH and value > 1:
                raise H2Error(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH out of range")
            # HEADER_TABLE_SIZE: we never index (frames.py); MAX_CONCURRENT_STREAMS: we push nothing;
            # MAX_HEADER_LIST_SIZE: our header blocks are a few fields of our own
        self._out.append(frames.SETTINGS_ACK)
        timer = self._timers.pop("handshake", None)
        if timer is not None:
            timer.cancel()
        if initial != self._peer_initial:
            # windows above 2^31-1 are not checked for (RFC 9113 §6.9.2): a stream's window is clamped instead
            delta, self._peer_initial = initial - self._peer_initial, initial
            self._initial_window_changed(delta)

    def _on_push_promise(self, flags: int, sid: int, payload: bytes) -> None:
        raise H2Error(PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise H2Error(FRAME_SIZE_ERROR, "PING of a wrong length")
        if sid:
            raise H2Error(PROTOCOL_ERROR, "PING on a stream")
        if flags & ACK:
            if payload == frames.GOAWAY_PING and self._announced:
                self._final_goaway()
            return
        if why := self.budget.control_frame(self.loop.time()):
            raise H2Error(ENHANCE_YOUR_CALM, why)
        self._out.append(frames.ping(payload, ack=True))

    def _on_goaway(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2Error(FRAME_SIZE_ERROR, "GOAWAY too short")
        self.going_away = True  # the client opens no more streams; the ones it opened may finish
        if int.from_bytes(payload[4:8], "big") != NO_ERROR or not self.streams:
            self._close()

    def _on_window_update(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong length")
        if why := self.budget.window_update():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if not increment:
                raise H2Error(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise H2Error(FLOW_CONTROL_ERROR, "the connection's send window overflowed")
            if self._waiting_conn:
                self._drain_waiting()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_stream:
                raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if not increment:
            self._stream_error(stream, PROTOCOL_ERROR)
            return
        stream.send_delta += increment
        if self._peer_initial + stream.send_delta > MAX_WINDOW:
            self._stream_error(stream, FLOW_CONTROL_ERROR)
        elif stream.pending is not None:
            self._drain(stream)

    def _on_unknown(self, flags: int, sid: int, payload: bytes) -> None:
        pass  # RFC 9113 §4.1: frames of unknown types are ignored

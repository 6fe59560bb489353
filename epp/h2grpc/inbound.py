"""The frames a client sends, applied to its connection (RFC 9113 §6, the server's side): mixed into Connection.

Every handler is O(1) in the number of open streams (a SETTINGS change visits only streams waiting for window).
A connection error raises H2Error (the connection sends GOAWAY with its code); a stream error resets the stream
and counts against the premature-reset budget; floods spend their budgets (budget.py).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, cast

import hpack

from epp.h2grpc import frames, inflate, status
from epp.h2grpc.frames import (
    ACK,
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2Error,
)
from epp.h2grpc.headers import HeaderDecoder
from epp.h2grpc.outbound import Outbound
from epp.h2grpc.stream import ServerStream

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection
    from epp.h2grpc.reader import FrameReader

log = logging.getLogger("epp.h2grpc.connection")
_SETTING = struct.Struct(">HI")


class Inbound(Outbound):
    # set up by Connection.__init__ (besides what Outbound declares)
    peer: str
    going_away: bool
    last_stream: int
    decoder: HeaderDecoder
    reader: FrameReader
    inflations: inflate.Queue
    max_message_bytes: int
    _block: bytearray | None
    _block_sid: int
    _block_flags: int
    _block_frames: int
    _block_self_dependent: bool
    _reset_ids: dict[int, None]
    _announced: bool
    _timers: dict[str, asyncio.TimerHandle]

    def _forget(self, stream: ServerStream) -> None:  # Connection: reset by either side
        raise NotImplementedError

    def _final_goaway(self) -> None:  # Connection
        raise NotImplementedError

    def _close(self) -> None:  # Connection
        raise NotImplementedError

    # ---- frames --------------------------------------------------------------------------------------------
    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        n = len(payload)
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if flags & PADDED:
            if n == 0 or payload[0] >= n:
                raise H2Error(PROTOCOL_ERROR, "DATA padding longer than the frame")
            payload = payload[1: n - payload[0]]
        self._recv_window -= n
        if self._recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "the connection's window was overrun")
        self._conn_unacked += n
        end = flags & END_STREAM
        if payload or end:
            self.budget.empty_run = 0
        elif why := self.budget.empty_frame():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_stream:
                raise H2Error(PROTOCOL_ERROR, "DATA on an idle stream")
            if sid not in self._reset_ids:
                raise H2Error(STREAM_CLOSED, "DATA on a closed stream")
            return  # in flight when we reset the stream; its bytes are given back with the connection's
        if stream.remote_ended:
            self._stream_error(stream, STREAM_CLOSED)
            return
        stream.recv_window -= n
        if stream.recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "a stream's window was overrun")
        if payload and stream.handler is not None:
            try:
                stream.feed(payload)
            except Exception as e:  # a handler bug ends its call, never the connection
                self.handler_failed(stream, e)
        if end:
            self._end_stream(stream)
        elif n and not stream.closed:
            stream.unacked += n
            self.window_may_open(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
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
        if len(block) > self.limits.max_header_list_bytes:
            raise H2Error(ENHANCE_YOUR_CALM, "a header block over the limit")
        if flags & END_HEADERS:
            self._header_block(sid, flags, block, self_dependent)
            return
        self._block = bytearray(block)
        self._block_sid, self._block_flags, self._block_frames = sid, flags, 0
        self._block_self_dependent = self_dependent
        self.reader.continuation = sid

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        block = self._block
        if block is None or sid != self._block_sid:
            raise H2Error(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        self._block_frames += 1
        if self._block_frames > self.limits.max_continuation_frames:
            raise H2Error(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if payload or flags & END_HEADERS:
            self.budget.empty_run = 0
        elif why := self.budget.empty_frame():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        block += payload
        if len(block) > self.limits.max_header_list_bytes:
            raise H2Error(ENHANCE_YOUR_CALM, "a header block over the limit")
        if flags & END_HEADERS:
            self._block = None
            self.reader.continuation = 0
            self._header_block(sid, self._block_flags, bytes(block), self._block_self_dependent)

    def _header_block(self, sid: int, flags: int, block: bytes, self_dependent: bool) -> None:
        try:  # always decoded, even for a stream we ignore: the decoder's table must follow the client's
            headers = self.decoder.decode(block)
        except hpack.OversizedHeaderListError as e:
            raise H2Error(ENHANCE_YOUR_CALM, "a header list over the limit") from e
        except Exception as e:  # any HPACK error
            raise H2Error(COMPRESSION_ERROR, "the header block cannot be decoded") from e
        stream = self.streams.get(sid)
        if stream is not None:  # trailers: carry nothing for gRPC
            if stream.remote_ended:
                self._stream_error(stream, STREAM_CLOSED)
            elif not flags & END_STREAM or self_dependent:
                self._stream_error(stream, PROTOCOL_ERROR)
            else:
                self._end_stream(stream)
            return
        if sid & 1 == 0:
            raise H2Error(PROTOCOL_ERROR, "a stream id the client may not use")
        if sid <= self.last_stream:
            if sid not in self._reset_ids:
                raise H2Error(PROTOCOL_ERROR, "HEADERS on a closed stream or a stream id going down")
            return  # trailers in flight when we reset the stream
        self.last_stream = sid
        self.budget.streams_opened += 1
        if self_dependent:
            self._refuse(sid, PROTOCOL_ERROR)
        elif self.going_away or len(self.streams) >= self.limits.max_concurrent_streams:
            self._refuse(sid, REFUSED_STREAM)
        else:
            self._open(sid, flags, headers)

    def _on_priority(self, flags: int, sid: int, payload: bytes) -> None:
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
            self._stream_error(stream, bad)

    def _on_rst_stream(self, flags: int, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "RST_STREAM of a wrong length")
        if sid == 0 or sid > self.last_stream:
            raise H2Error(PROTOCOL_ERROR, "RST_STREAM on stream 0 or an idle stream")
        stream = self.streams.get(sid)
        if stream is None:
            return
        premature = not stream.started and self.loop.time() - stream.opened_at < self.limits.premature_reset_seconds
        self._forget(stream)
        if premature:
            self._premature()

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

    # ---- streams -------------------------------------------------------------------------------------------
    def _open(self, sid: int, flags: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = method = ctype = timeout = None
        for k, v in headers:
            if k == b":path":
                path = v
            elif k == b":method":
                method = v
            elif k == b"content-type":
                ctype = v
            elif k == b"grpc-timeout":
                timeout = v
        conn = cast("Connection", self)
        stream = ServerStream(conn, sid, (path or b"").decode("latin-1"), headers)
        stream.recv_window = self.limits.initial_stream_window
        stream.opened_at = self.loop.time()
        if not self.streams:
            self.server.connection_busy(conn)
        self.streams[sid] = stream
        if flags & END_STREAM:
            stream.remote_ended = True
        if method != b"POST" or ctype is None or not ctype.startswith(b"application/grpc"):
            self.reply_status(stream, 405 if method != b"POST" else 415)
            return
        factory = self.server.route(stream.path)
        if factory is None:
            stream.finish(status.UNIMPLEMENTED, "Method not found!")
            return
        if timeout is not None:
            seconds = status.parse_timeout(timeout)
            if seconds is None:
                stream.finish(status.INTERNAL, "Invalid grpc-timeout header")
                return
            stream.timer = self.loop.call_later(seconds, stream.deadline_exceeded)
        try:
            stream.handler = factory(stream)
        except Exception as e:
            log.exception("cannot start %s", stream.path)
            stream.finish(status.INTERNAL, f"cannot start the call: {type(e).__name__}")
            return
        if flags & END_STREAM:
            self._end_stream(stream)

    def _end_stream(self, stream: ServerStream) -> None:
        try:
            stream.end()
        except Exception as e:
            self.handler_failed(stream, e)

    def handler_failed(self, stream: ServerStream, error: Exception) -> None:
        log.error("%s: handler failed", stream.path, exc_info=error)
        try:
            stream.fail(status.INTERNAL, f"handler failed: {error}")
        except Exception:
            log.exception("%s: the handler failed again while cancelling", stream.path)

    def _stream_error(self, stream: ServerStream, code: int) -> None:
        """A client's error on one stream: RST_STREAM; the call is cancelled; it counts as a premature reset."""
        self.reset(stream.id, code)
        self._forget(stream)
        self._premature()

    def _refuse(self, sid: int, code: int) -> None:
        self.reset(sid, code)
        self._premature()

    def _premature(self) -> None:
        if why := self.budget.premature_reset():
            raise H2Error(ENHANCE_YOUR_CALM, why)

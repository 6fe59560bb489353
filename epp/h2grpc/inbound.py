"""The frames a client sends on its streams (RFC 9113 §6.1-6.4, §6.10, the server's side): mixed into Connection.

DATA, HEADERS (with CONTINUATION) and the stream-level PRIORITY and RST_STREAM; the connection-scoped frames are
`Control`'s (control.py), and what a stream's frames do to the table of open streams is `StreamTable`'s
(streamtable.py). Every handler is O(1) in the number of open streams. A connection error raises H2Error (the
connection sends GOAWAY with its code); a stream error resets the stream and counts against the premature-reset
budget; floods spend their budgets (budget.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hpack

from epp.h2grpc import inflate
from epp.h2grpc.control import Control
from epp.h2grpc.frames import (
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2Error,
)
from epp.h2grpc.headers import HeaderDecoder

if TYPE_CHECKING:
    from epp.h2grpc.reader import FrameReader


class Inbound(Control):
    # set up by Connection.__init__ (besides what Control declares)
    peer: str
    decoder: HeaderDecoder
    reader: FrameReader
    inflations: inflate.Queue
    max_message_bytes: int
    _block: bytearray | None
    _block_sid: int
    _block_flags: int
    _block_frames: int
    _block_self_dependent: bool

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

"""One HTTP/2 connection of the gRPC server (RFC 9113, the server's side, what gRPC needs): an asyncio Protocol.

- Reading: `FrameReader` (reader.py) cuts each read into frames, checking a frame's length on its header; the
  handlers here apply them. Request bodies go to the streams, which hand complete messages to their handlers
  synchronously. Header blocks are size-checked in bytes, then decoded with `hpack`.
- Streams: a dict of the open ones (its size is the open-stream count); client stream ids only grow, so anything
  at or below the highest seen and not in the table is closed. Beyond SETTINGS_MAX_CONCURRENT_STREAMS a new stream
  gets RST_STREAM REFUSED_STREAM.
- Work a client causes without getting any done is budgeted (budget.py); a connection error, or a spent budget,
  ends the connection with GOAWAY and the matching code. An exception anywhere in handling a read does too (logged),
  never the server.
- While the socket does not take our writes (`pause_writing`), the connection is not read.
- Timers: the preface must arrive within `handshake_timeout`; a connection without streams for `idle_timeout` is
  closed; at `max_connection_age` (±10%) it gets a graceful GOAWAY and `max_connection_age_grace` to finish.
- Graceful GOAWAY, as grpc and Envoy do it: first a GOAWAY announcing the end (last stream 2^31-1) and a PING; on its
  ACK (or after a second) the final GOAWAY with the last stream id. Streams opened in between are served, so a
  client never loses a request to the race. A client GOAWAY lets the streams it already opened finish.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import hpack

from epp.h2grpc import frames, inflate, status
from epp.h2grpc.budget import Budget
from epp.h2grpc.frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    INTERNAL_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2Error,
)
from epp.h2grpc.outbound import Outbound
from epp.h2grpc.reader import FrameReader
from epp.h2grpc.stream import ServerStream

if TYPE_CHECKING:
    from epp.h2grpc.server import H2Server

log = logging.getLogger(__name__)

_SETTING = struct.Struct(">HI")
_GOAWAY_PING = b"goaway\x00\x00"
_FINAL_GOAWAY_AFTER = 1.0  # seconds from the announcing GOAWAY to the final one, when the PING is not answered
_ABORT_AFTER = 1.0  # seconds a closing connection may take to flush before it is aborted


def _peer(transport: asyncio.BaseTransport) -> str:
    addr = transport.get_extra_info("peername")
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{addr}" if addr else "unknown"


class Connection(Outbound, asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.limits = lim = server.limits
        self.loop = asyncio.get_running_loop()
        self.max_message_bytes = lim.max_message_bytes
        self.streams = {}
        self.transport = None
        self.peer = "unknown"
        self.going_away = False  # the final GOAWAY is sent, or the client sent one: no new streams
        self.last_stream = 0  # the highest client stream id seen
        self.budget = Budget(lim, self.loop.time())
        self.decoder = hpack.Decoder(max_header_list_size=lim.max_header_list_bytes)
        self.reader = FrameReader(lim.max_frame_size, [
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream, self._on_settings,
            self._on_push_promise, self._on_ping, self._on_goaway, self._on_window_update, self._on_continuation,
        ], self._on_unknown)
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._block_sid = 0
        self._block_flags = 0
        self._block_frames = 0
        self._block_self_dependent = False
        self._reset_ids: dict[int, None] = {}  # streams we reset lately, oldest first
        self._reset_memory = max(4096, 2 * lim.max_concurrent_streams)
        # the sending side (outbound.py)
        self._out = []
        self._receiving = False
        self._flush_scheduled = False
        self._write_paused = False
        self._drained = None
        self._peer_initial = frames.DEFAULT_WINDOW
        self._send_window = frames.DEFAULT_WINDOW
        self._max_out_frame = 16384
        self._recv_window = frames.DEFAULT_WINDOW
        self._conn_unacked = lim.initial_connection_window - frames.DEFAULT_WINDOW  # granted at the first flush
        self._waiting_conn = {}
        self._waiting_stream = {}
        self.out_pending = 0
        self.held = 0
        self.reserved = 0
        # lifecycle
        self.idle_since = self.loop.time()
        self._closing = False
        self._announced = False  # the announcing GOAWAY is sent
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.inflations = inflate.Queue(self.loop, server.inflater, lim.max_message_bytes)

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes
        self.peer = _peer(transport)
        lim = self.limits
        if not self.server.admit(self):
            log.warning("refusing a connection from %s: %d connections are open, none idle", self.peer,
                        len(self.server.connections))
            t.abort()
            return
        t.set_write_buffer_limits(high=lim.write_buffer_bytes)
        values = [(frames.MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
                  (frames.INITIAL_WINDOW_SIZE, lim.initial_stream_window),
                  (frames.MAX_HEADER_LIST_SIZE, lim.max_header_list_bytes)]
        if lim.max_frame_size != 16384:
            values.append((frames.MAX_FRAME_SIZE, lim.max_frame_size))
        self._out.append(frames.settings(values))
        self._flush()  # with the connection's window, unless the server holds too much already
        self._timer("handshake", lim.handshake_timeout, self._handshake_expired)
        if lim.max_connection_age:
            self._timer("age", lim.max_connection_age * random.uniform(0.9, 1.1), self._age_reached)
        self._became_idle()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._receiving = True
        try:
            self.reader.feed(data)
        except H2Error as e:
            self._receiving = False
            self._fail(e.code, str(e))
            return
        except Exception:
            log.exception("HTTP/2 connection from %s: failed handling a read", self.peer)
            self._receiving = False
            self._fail(INTERNAL_ERROR, "internal error")
            return
        self._receiving = False
        self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.reader.stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.server.connection_gone(self)
        self.inflations.clear()
        streams = list(self.streams.values())
        for s in streams:
            self._forget(s)
        self.transport = None
        self._out = []
        self._wake_writers()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is None or self._closing:
            return
        self.transport.resume_reading()
        self._drain_waiting()
        self._flush()
        self._wake_writers()

    # ---- frames ----------------------------------------------------------------------------------------------
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
            headers = self.decoder.decode(block, raw=True)
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
            self._open(sid, flags, cast("list[tuple[bytes, bytes]]", headers))

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
            if payload == _GOAWAY_PING and self._announced:
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

    # ---- streams ---------------------------------------------------------------------------------------------
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
        stream = ServerStream(self, sid, (path or b"").decode("latin-1"), headers)
        stream.recv_window = self.limits.initial_stream_window
        stream.opened_at = self.loop.time()
        if not self.streams:
            self.server.connection_busy(self)
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

    def reset(self, sid: int, code: int) -> None:
        """RST_STREAM from us. Frames the client sent before it learns of it are ignored, for the last few
        thousand streams reset; on other closed streams they are connection errors (RFC 9113 §5.1)."""
        self._out.append(frames.rst_stream(sid, code))
        reset = self._reset_ids
        reset[sid] = None
        if len(reset) > self._reset_memory:
            del reset[next(iter(reset))]

    def _premature(self) -> None:
        if why := self.budget.premature_reset():
            raise H2Error(ENHANCE_YOUR_CALM, why)

    def _remove(self, stream: ServerStream) -> None:
        """The stream leaves the table (closed both ways, or reset); its buffers leave the connection's budget."""
        if self.streams.pop(stream.id, None) is None:
            return
        if stream.pending_bytes:
            self.out_pending -= stream.pending_bytes
            self.server.buffered -= stream.pending_bytes
            stream.pending_bytes = 0
            stream.pending = None
        self._waiting_conn.pop(stream, None)
        self._waiting_stream.pop(stream, None)
        if stream.reserved:
            self.unreserve(stream)
        if stream.held:
            self.held -= stream.held
            self.server.buffered -= stream.held
            stream.held = 0
        if not self.streams:
            self._became_idle()

    def _forget(self, stream: ServerStream) -> None:
        """Reset, by either side, or the connection is gone: the call is cancelled."""
        self._remove(stream)
        stream.lost()

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _timer(self, name: str, delay: float, callback: Callable[[], object]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        self._timers[name] = self.loop.call_later(delay, callback)

    def _became_idle(self) -> None:
        self.idle_since = self.loop.time()
        self.server.connection_idle(self)
        if self.going_away and self.transport is not None:  # after GOAWAY (ours or the client's): done
            self._close()
            return
        if self.limits.idle_timeout and "idle" not in self._timers:
            self._timer("idle", self.limits.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        del self._timers["idle"]
        if self.streams or self.transport is None:
            return  # busy: armed again when it is idle again
        left = self.idle_since + self.limits.idle_timeout - self.loop.time()
        if left > 0.001:
            self._timer("idle", left, self._idle_check)
            return
        log.debug("closing the idle connection from %s", self.peer)
        self.close_idle()

    def close_idle(self) -> None:
        """A connection without streams: the final GOAWAY at once, then close."""
        if self.transport is not None and not self._closing:
            self._out.append(frames.goaway(self.last_stream, NO_ERROR))
        self._close()

    def _handshake_expired(self) -> None:
        self._timers.pop("handshake", None)
        log.debug("no HTTP/2 preface from %s in time", self.peer)
        self._close()

    def _age_reached(self) -> None:
        self._timers.pop("age", None)
        self.goaway(self.limits.max_connection_age_grace)

    def goaway(self, grace: float | None = None) -> None:
        """Graceful: announce GOAWAY, then the final one; no new streams after it; the open ones may finish (within
        `grace` seconds, if given; then they are cancelled)."""
        if self.transport is None or self._closing:
            return
        if grace is not None:
            self._timer("grace", grace, self.cancel_all)
        if self._announced:
            return
        self._announced = True
        self._out.append(frames.goaway(frames.LAST_STREAM, NO_ERROR))
        self._out.append(frames.ping(_GOAWAY_PING, ack=False))
        self._timer("final", _FINAL_GOAWAY_AFTER, self._final_goaway)
        self._flush()

    def _final_goaway(self) -> None:
        timer = self._timers.pop("final", None)
        if timer is not None:
            timer.cancel()
        if self.going_away or self.transport is None:
            return
        self.going_away = True
        self._out.append(frames.goaway(self.last_stream, NO_ERROR))
        if not self.streams:
            self._close()
        else:
            self._flush()

    def cancel_all(self) -> None:
        """Stop now: every open call is cancelled and reset, then the connection closes."""
        self._timers.pop("grace", None)
        for stream in list(self.streams.values()):
            if not stream.closed:
                self.reset(stream.id, CANCEL)
            self._forget(stream)
        self._close()

    def _fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with its code, then close."""
        log.debug("HTTP/2 connection error from %s: %s", self.peer, reason)
        self._out.append(frames.goaway(self.last_stream, code))
        self._close()

    def _close(self) -> None:
        """Flush and close; a peer that does not take the last bytes within a second is cut off."""
        self.reader.stopped = True
        if self._closing:
            return
        self._closing = True
        self._flush()
        transport = self.transport
        if transport is not None:
            transport.close()
            self.loop.call_later(_ABORT_AFTER, transport.abort)

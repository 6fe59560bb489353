"""One HTTP/2 connection of the gRPC server (RFC 9113, the server's side, what gRPC needs): an asyncio Protocol.

- Reading: `FrameReader` (reader.py) cuts each read into frames, checking a frame's length on its header;
  `Inbound` (inbound.py: a stream's frames) and `Control` (control.py: the connection's) apply them. Request
  bodies go to the streams, which hand complete messages to their handlers synchronously. Header blocks are
  size-checked in bytes, then decoded with `hpack`. The sending side and flow control both ways are `Outbound`
  (outbound.py).
- Streams: a dict of the open ones (its size is the open-stream count), kept by `StreamTable` (streamtable.py);
  client stream ids only grow, so anything at or below the highest seen and not in the table is closed. Beyond
  SETTINGS_MAX_CONCURRENT_STREAMS a new stream gets RST_STREAM REFUSED_STREAM.
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
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from epp.h2grpc import frames, inflate
from epp.h2grpc.budget import Budget
from epp.h2grpc.frames import (
    CANCEL,
    INTERNAL_ERROR,
    NO_ERROR,
    H2Error,
)
from epp.h2grpc.headers import HeaderDecoder
from epp.h2grpc.inbound import Inbound
from epp.h2grpc.reader import FrameReader

if TYPE_CHECKING:
    from epp.h2grpc.server import H2Server

log = logging.getLogger(__name__)

_FINAL_GOAWAY_AFTER = 1.0  # seconds from the announcing GOAWAY to the final one, when the PING is not answered
_ABORT_AFTER = 1.0  # seconds a closing connection may take to flush before it is aborted


def _peer(transport: asyncio.BaseTransport) -> str:
    addr = transport.get_extra_info("peername")
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{addr}" if addr else "unknown"


class Connection(Inbound, asyncio.Protocol):
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
        self.decoder = HeaderDecoder(lim.max_header_list_bytes)
        self.reader = FrameReader(lim.max_frame_size, [
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream, self._on_settings,
            self._on_push_promise, self._on_ping, self._on_goaway, self._on_window_update, self._on_continuation,
        ], self._on_unknown)
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._block_sid = 0
        self._block_flags = 0
        self._block_frames = 0
        self._block_self_dependent = False
        self._reset_ids = {}  # streams we reset lately, oldest first (streamtable.py)
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
        self._out.append(frames.ping(frames.GOAWAY_PING, ack=False))
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

"""One HTTP/2 connection of the gRPC server (RFC 9113, the server's side, what gRPC needs): an asyncio Protocol.

The connection owns its parts and wires them together; each has its own state and a narrow interface:
- `FrameReader` (reader.py) cuts each read into frames, checking a frame's length on its header, and hands each to
  `Inbound` (inbound.py: a stream's frames, DATA, HEADERS, CONTINUATION, PRIORITY, RST_STREAM) or `Control`
  (control.py: the connection's, SETTINGS, PING, GOAWAY, WINDOW_UPDATE). Header blocks are assembled and
  size-checked in bytes, then decoded with `hpack` (`HeaderAssembly`, headers.py).
- `StreamTable` (streamtable.py): the open streams, a dict whose size is the open-stream count; client stream ids
  only grow, so anything at or below the highest seen and not in the table is closed. Beyond
  SETTINGS_MAX_CONCURRENT_STREAMS a new stream gets RST_STREAM REFUSED_STREAM. Each stream (`ServerStream`,
  stream.py) owns its message assembly (assembly.py).
- `Outbound` (outbound.py): the sending side, writes coalesced once per read, and the windows we send within;
  `ReceiveWindows` (windows.py): the windows the client sends within, given back as the buffer budgets allow.
- `Budget` (budget.py): work a client causes without getting any done; a connection error, or a spent budget,
  ends the connection with GOAWAY and the matching code. An exception anywhere in handling a read does too
  (logged), never the server.

The connection itself keeps the socket's life (the `Lifecycle` its control frames report to):
- Reads go into the server's one read buffer (`get_buffer`, `buffer_updated`), not into a new bytes object each:
  CPython's `recv` allocates its whole read size (256 KiB) for every read and shrinks it after, which cost tens of
  µs per read. Frames are handled in place, and whatever outlives the read is copied out of it.
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
from epp.h2grpc.control import Control
from epp.h2grpc.frames import INTERNAL_ERROR, NO_ERROR, H2Error
from epp.h2grpc.headers import HeaderAssembly
from epp.h2grpc.inbound import Inbound
from epp.h2grpc.outbound import Outbound
from epp.h2grpc.reader import FrameReader
from epp.h2grpc.sockwrite import direct_fd
from epp.h2grpc.streamtable import StreamTable
from epp.h2grpc.windows import ReceiveWindows

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


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.limits = lim = server.limits
        self.loop = loop = asyncio.get_running_loop()
        self.max_message_bytes = lim.max_message_bytes
        self.peer = "unknown"
        self.budget = budget = Budget(lim, loop.time())
        self.out = out = Outbound(server, budget, loop)
        self.windows = windows = ReceiveWindows(server, out)
        self.table = table = StreamTable(self, out, windows, budget, loop)
        out.wire(table, windows)
        self.streams = table.streams  # the open ones (the table's)
        self.reader = reader = FrameReader(lim.max_frame_size)
        inbound = Inbound(reader, table, windows, HeaderAssembly(lim, budget), budget, lim, loop)
        control = Control(self, out, table, budget, loop)
        reader.dispatch_to([
            inbound.on_data, inbound.on_headers, inbound.on_priority, inbound.on_rst_stream, control.on_settings,
            control.on_push_promise, control.on_ping, control.on_goaway, control.on_window_update,
            inbound.on_continuation,
        ], control.on_unknown)
        self.inflations = inflate.Queue(loop, server.inflater, lim.max_message_bytes)
        # lifecycle
        self.idle_since = loop.time()
        self._closing = False
        self._announced = False  # the announcing GOAWAY is sent
        self._timers: dict[str, asyncio.TimerHandle] = {}

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.out.transport

    @property
    def out_pending(self) -> int:
        """Bytes of replies queued on the streams, waiting for a window or the socket."""
        return self.out.out_pending

    @property
    def _write_paused(self) -> bool:  # the socket does not take our writes (tests look)
        return self.out.paused

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.out.transport = t = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes
        self.out.fd = direct_fd(t)
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
        self.out.send_frame(frames.settings(values))
        self.out.flush()  # with the connection's window, unless the server holds too much already
        self._timer("handshake", lim.handshake_timeout, self._handshake_expired)
        if lim.max_connection_age:
            self._timer("age", lim.max_connection_age * random.uniform(0.9, 1.1), self._age_reached)
        self.became_idle()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: the server's one read buffer. Nothing keeps a view of it past
        `buffer_updated` (the frame reader copies what it keeps), so every connection can share it."""
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.server.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self._closing:
            return
        out = self.out
        out.receiving = True
        try:
            self.reader.feed(data)
        except H2Error as e:
            out.receiving = False
            self._fail(e.code, str(e))
            return
        except Exception:
            log.exception("HTTP/2 connection from %s: failed handling a read", self.peer)
            out.receiving = False
            self._fail(INTERNAL_ERROR, "internal error")
            return
        out.receiving = False
        out.flush()

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
        self.table.lost()
        self.out.lost()

    def pause_writing(self) -> None:
        self.out.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        out = self.out
        out.paused = False
        if out.transport is None or self._closing:
            return
        out.transport.resume_reading()
        out.drain_waiting()
        out.flush()
        out.wake_writers()

    # ---- lifecycle (what the stream table and the control frames report) ---------------------------------------
    def busy(self) -> None:
        """The first stream opened."""
        self.server.connection_busy(self)

    def became_idle(self) -> None:
        """No stream is open (any more)."""
        self.idle_since = self.loop.time()
        self.server.connection_idle(self)
        if self.table.going_away and self.transport is not None:  # after GOAWAY (ours or the client's): done
            self._close()
            return
        if self.limits.idle_timeout and "idle" not in self._timers:
            self._timer("idle", self.limits.idle_timeout, self._idle_check)

    def settled(self) -> None:
        """The client's SETTINGS came: the handshake is done."""
        timer = self._timers.pop("handshake", None)
        if timer is not None:
            timer.cancel()

    def ping_acked(self, payload: bytes) -> None:
        if payload == frames.GOAWAY_PING and self._announced:
            self._final_goaway()

    def client_goaway(self, code: int) -> None:
        """The client opens no more streams; the ones it opened may finish (unless it ends with an error)."""
        self.table.going_away = True
        if code != NO_ERROR or not self.streams:
            self._close()

    def _timer(self, name: str, delay: float, callback: Callable[[], object]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        self._timers[name] = self.loop.call_later(delay, callback)

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
            self.out.send_frame(frames.goaway(self.table.last_stream, NO_ERROR))
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
        out = self.out
        out.send_frame(frames.goaway(frames.LAST_STREAM, NO_ERROR))
        out.send_frame(frames.ping(frames.GOAWAY_PING, ack=False))
        self._timer("final", _FINAL_GOAWAY_AFTER, self._final_goaway)
        out.flush()

    def _final_goaway(self) -> None:
        timer = self._timers.pop("final", None)
        if timer is not None:
            timer.cancel()
        table = self.table
        if table.going_away or self.transport is None:
            return
        table.going_away = True
        self.out.send_frame(frames.goaway(table.last_stream, NO_ERROR))
        if not self.streams:
            self._close()
        else:
            self.out.flush()

    def cancel_all(self) -> None:
        """Stop now: every open call is cancelled and reset, then the connection closes."""
        self._timers.pop("grace", None)
        self.table.cancel_all()
        self._close()

    def _fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with its code, then close."""
        log.debug("HTTP/2 connection error from %s: %s", self.peer, reason)
        self.out.send_frame(frames.goaway(self.table.last_stream, code))
        self._close()

    def _close(self) -> None:
        """Flush and close; a peer that does not take the last bytes within a second is cut off."""
        self.reader.stopped = True
        if self._closing:
            return
        self._closing = True
        self.out.flush()
        transport = self.transport
        if transport is not None:
            transport.close()
            self.loop.call_later(_ABORT_AFTER, transport.abort)

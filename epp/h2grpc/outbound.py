"""The sending half of a connection: response headers, messages, trailers, and the windows we send within.

- Writes are coalesced: frames produced while a read is handled leave in one write at the end of it; frames
  produced elsewhere (a task, a timer) schedule one flush for the current loop iteration.
- Outbound flow control: data beyond the peer's stream or connection window, or while the socket is not taking
  more (`pause_writing`), waits on its stream, trailers behind it. A stream waits in one of two queues: for its own
  window, or for the connection (window or socket). Only those streams are visited when a window opens, and a
  change of SETTINGS_INITIAL_WINDOW_SIZE is O(1) per stream: a stream's window is kept relative to it.
- What the client may send (our receive windows) is `ReceiveWindows`' (windows.py); `Outbound` asks it for the
  connection's WINDOW_UPDATE at each flush, and tells it when a stream's queued replies have left.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from epp.h2grpc import frames, status
from epp.h2grpc.frames import (
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    HEADERS,
    MAX_WINDOW,
    RESPONSE_HEADERS,
    H2Error,
)
from epp.h2grpc.sockwrite import write_pieces

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.server import H2Server
    from epp.h2grpc.stream import ServerStream
    from epp.h2grpc.streamtable import StreamTable
    from epp.h2grpc.windows import ReceiveWindows

_header = frames.header
_RESPONSE_HEADERS_LEN = len(RESPONSE_HEADERS)


class Outbound:
    __slots__ = ("server", "loop", "budget", "table", "windows", "transport", "fd", "frames", "receiving",
                 "_flush_scheduled", "paused", "_drained", "peer_initial", "send_window", "max_frame", "_waiting_conn",
                 "_waiting_stream", "out_pending")

    def __init__(self, server: H2Server, budget: Budget, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.budget = budget
        self.table: StreamTable  # `wire`: where a stream goes once our side is done
        self.windows: ReceiveWindows  # `wire`: the receive windows, given back at each flush
        self.transport: asyncio.Transport | None = None  # set by the connection while it is open
        self.fd = -1  # the socket, when flushes write their pieces to it directly (sockwrite.py)
        self.frames: list[bytes | memoryview] = []  # what the next flush writes
        self.receiving = False  # a read is being handled: it flushes at its end
        self._flush_scheduled = False
        self.paused = False  # the socket does not take more (`pause_writing`)
        self._drained: asyncio.Future[None] | None = None  # `writable` waits on it
        self.peer_initial = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.send_window = DEFAULT_WINDOW  # the connection's send window
        self.max_frame = 16384  # the peer's SETTINGS_MAX_FRAME_SIZE
        self._waiting_conn: dict[ServerStream, None] = {}  # data waiting for the connection window or the socket
        self._waiting_stream: dict[ServerStream, None] = {}  # data waiting for the stream's own window
        self.out_pending = 0  # bytes queued on all streams

    def wire(self, table: StreamTable, windows: ReceiveWindows) -> None:
        self.table = table
        self.windows = windows

    # ---- replies -------------------------------------------------------------------------------------------
    def send_data(self, stream: ServerStream, data: bytes) -> None:
        self.send_parts(stream, (data,))

    def send_parts(self, stream: ServerStream, parts: Sequence[bytes | memoryview]) -> None:
        """Data for the stream, in pieces: a DATA frame carries as many pieces, or pieces of pieces, as fit; no
        piece is joined to another or copied. What exceeds a window (or finds the socket paused) waits on the
        stream."""
        if stream.closed or self.transport is None:
            return
        out = self.frames
        sid = stream.id
        if not stream.started:
            stream.started = True
            out.append(_header(_RESPONSE_HEADERS_LEN, HEADERS, END_HEADERS, sid) + RESPONSE_HEADERS)
        n = sum(map(len, parts))
        if (stream.pending is None and not self.paused and n <= self.max_frame
                and n <= self.send_window and n <= self.peer_initial + stream.send_delta):
            out.append(_header(n, DATA, 0, sid))
            out += parts
            stream.send_delta -= n
            self.send_window -= n
            self.budget.data_frames_sent += 1
        else:
            self._queue(stream, parts, n)
        if not self.receiving and not self._flush_scheduled:
            self._schedule_flush()

    def _queue(self, stream: ServerStream, parts: Sequence[bytes | memoryview], n: int) -> None:
        """Data waiting on the stream (its window, the connection's, or the socket): sent by `drain`."""
        pending = stream.pending
        if pending is None:
            pending = stream.pending = deque()
        was_empty = not pending
        pending.extend(memoryview(p) for p in parts if len(p))
        stream.pending_bytes += n
        self.out_pending += n
        self.server.buffered += n
        if was_empty:
            self.drain(stream)

    def send_headers(self, stream: ServerStream, metadata: list[tuple[bytes, bytes]]) -> None:
        if stream.closed or self.transport is None:
            return
        stream.started = True
        self._headers(stream.id, RESPONSE_HEADERS + frames.encode_fields(metadata), False)
        self.written()

    def send_trailers(self, stream: ServerStream, code: int, message: str,
                      metadata: list[tuple[bytes, bytes]] | None) -> None:
        if stream.closed or self.transport is None:
            return
        block = frames.status_literal(code)
        if message:
            block += frames.literal(b"grpc-message", status.encode_grpc_message(message))
        if metadata:
            block += frames.encode_fields(metadata)
        if not stream.started:  # trailers-only response
            stream.started = True
            self._headers(stream.id, RESPONSE_HEADERS + block, True)
            self.table.closed_locally(stream)
        elif stream.pending is not None:
            stream.trailers = block
        else:
            self._headers(stream.id, block, True)
            self.table.closed_locally(stream)
        if not self.receiving and not self._flush_scheduled:
            self._schedule_flush()

    def reply_status(self, stream: ServerStream, http_status: int) -> None:
        """A plain HTTP response with no body (a request that is not gRPC)."""
        stream.started = True
        self._headers(stream.id, frames.status_only(http_status), True)
        self.table.closed_locally(stream)
        self.written()

    def _headers(self, sid: int, block: bytes, end_stream: bool) -> None:
        self.frames += frames.headers(sid, block, end_stream, self.max_frame)

    # ---- flow control, sending -------------------------------------------------------------------------------
    def drain(self, stream: ServerStream) -> None:
        """Send what waits on the stream, as far as the windows and the socket allow."""
        pending = stream.pending
        if pending is None:
            return
        out = self.frames
        sid = stream.id
        budget = self.budget
        sent = 0
        while pending:
            if self.paused or self.send_window <= 0:
                self._waiting_stream.pop(stream, None)
                self._waiting_conn[stream] = None
                break
            window = self.peer_initial + stream.send_delta
            if window <= 0:
                self._waiting_conn.pop(stream, None)
                self._waiting_stream[stream] = None
                break
            n = min(window, self.send_window, self.max_frame, stream.pending_bytes - sent)
            out.append(_header(n, DATA, 0, sid))
            _take(pending, n, out)
            stream.send_delta -= n
            self.send_window -= n
            sent += n
            budget.data_frames_sent += 1
        stream.pending_bytes -= sent
        self.out_pending -= sent
        self.server.buffered -= sent
        if pending:
            if sent:
                self.written()
            return
        stream.pending = None
        self._waiting_conn.pop(stream, None)
        self._waiting_stream.pop(stream, None)
        if stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._headers(sid, block, True)
            self.table.closed_locally(stream)
        else:
            self.windows.window_may_open(stream)
        self.written()
        self.wake_writers()

    def drain_waiting(self) -> None:
        """The connection window opened or the socket drained: streams waiting for it go, in arrival order."""
        waiting = self._waiting_conn
        while waiting and self.send_window > 0 and not self.paused and self.transport is not None:
            stream = next(iter(waiting))
            del waiting[stream]
            self.drain(stream)

    def window_update(self, increment: int) -> None:
        """The client's WINDOW_UPDATE for the connection (not 0)."""
        self.send_window += increment
        if self.send_window > MAX_WINDOW:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "the connection's send window overflowed")
        if self._waiting_conn:
            self.drain_waiting()

    def stream_window_update(self, stream: ServerStream, increment: int) -> bool:
        """The client's WINDOW_UPDATE for one stream (not 0); False when it overflows the stream's window."""
        stream.send_delta += increment
        if self.peer_initial + stream.send_delta > MAX_WINDOW:
            return False
        if stream.pending is not None:
            self.drain(stream)
        return True

    def initial_window(self, value: int) -> None:
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE changed: every stream's window moves with it (windows above
        2^31-1 are not checked for, RFC 9113 §6.9.2: a stream's window is clamped instead)."""
        delta, self.peer_initial = value - self.peer_initial, value
        if delta > 0:
            for stream in list(self._waiting_stream):
                if self.peer_initial + stream.send_delta > 0:
                    del self._waiting_stream[stream]
                    self.drain(stream)

    def drop(self, stream: ServerStream) -> None:
        """The stream left the table: what waits on it leaves the connection's and the server's counts."""
        if stream.pending_bytes:
            self.out_pending -= stream.pending_bytes
            self.server.buffered -= stream.pending_bytes
            stream.pending_bytes = 0
            stream.pending = None
        self._waiting_conn.pop(stream, None)
        self._waiting_stream.pop(stream, None)

    # ---- writing -------------------------------------------------------------------------------------------
    async def writable(self, stream: ServerStream, limit: int = 1 << 20) -> None:
        """Wait while more than `limit` bytes wait on this stream's window or the socket is paused."""
        while self.transport is not None and not stream.closed and (
                self.paused or stream.pending_bytes > limit):
            if self._drained is None or self._drained.done():
                self._drained = self.loop.create_future()
            await self._drained

    def wake_writers(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def send_frame(self, frame: bytes) -> None:
        """A frame of the connection's own (WINDOW_UPDATE, RST_STREAM, GOAWAY, PING, SETTINGS): sent with the
        next flush."""
        self.frames.append(frame)

    def written(self) -> None:
        if not self.receiving and not self._flush_scheduled:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        self._flush_scheduled = True
        self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        windows = self.windows
        if windows.conn_unacked:
            grant = windows.connection_grant(self.out_pending)
            if grant:
                self.frames.append(grant)
        out = self.frames
        if out:
            self.frames = []
            if self.transport is not None:
                write_pieces(self.transport, self.fd, out)

    def lost(self) -> None:
        """The socket is gone: nothing more is written; writers waiting for room go on (and find it closed)."""
        self.transport = None
        self.fd = -1
        self.frames = []
        self.wake_writers()


def _take(pending: deque[memoryview], n: int, out: list[bytes | memoryview]) -> None:
    """Move the first `n` bytes of `pending` to `out`: whole pieces, then the start of one (views: no copies)."""
    while n:
        head = pending[0]
        k = len(head)
        if k <= n:
            pending.popleft()
            out.append(head)
            n -= k
        else:
            pending[0] = head[n:]
            out.append(head[:n])
            return

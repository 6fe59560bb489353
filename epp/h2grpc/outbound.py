"""The sending half of a connection: response headers, messages, trailers, and flow control both ways.

- Writes are coalesced: frames produced while a read is handled leave in one write at the end of it; frames
  produced elsewhere (a task, a timer) schedule one flush for the current loop iteration.
- Outbound flow control: data beyond the peer's stream or connection window, or while the socket is not taking
  more (`pause_writing`), waits on its stream, trailers behind it. A stream waits in one of two queues: for its own
  window, or for the connection (window or socket). Only those streams are visited when a window opens, and a
  change of SETTINGS_INITIAL_WINDOW_SIZE is O(1) per stream: a stream's window is kept relative to it.
- Inbound flow control: a stream's window is given back (WINDOW_UPDATE) once half of it is used, unless the
  replies queued on it (and what its handler holds unread) exceed `max_stream_buffer_bytes`; the connection's
  window likewise, unless the connection holds more than `max_connection_buffer_bytes`. A client that does not
  read its replies therefore stops being able to send.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from epp.h2grpc import frames, status
from epp.h2grpc.frames import DATA, END_HEADERS, HEADERS, NO_ERROR, RESPONSE_HEADERS

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.limits import ServerLimits
    from epp.h2grpc.server import H2Server
    from epp.h2grpc.stream import ServerStream

_header = frames.header
_RESPONSE_HEADERS_LEN = len(RESPONSE_HEADERS)


class Outbound:
    # set up by Connection.__init__
    server: H2Server
    limits: ServerLimits
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    streams: dict[int, ServerStream]
    budget: Budget
    _out: list[bytes | memoryview]
    _receiving: bool
    _flush_scheduled: bool
    _write_paused: bool
    _drained: asyncio.Future[None] | None
    _peer_initial: int  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
    _send_window: int  # the connection's send window
    _max_out_frame: int  # the peer's SETTINGS_MAX_FRAME_SIZE
    _recv_window: int  # what the client may still send on the connection
    _conn_unacked: int
    _waiting_conn: dict[ServerStream, None]  # data waiting for the connection window or the socket
    _waiting_stream: dict[ServerStream, None]  # data waiting for the stream's own window
    out_pending: int  # bytes queued on all streams
    held: int  # bytes handlers hold unread
    reserved: int  # bytes reserved for messages being assembled

    def _remove(self, stream: ServerStream) -> None:  # Connection: the stream leaves the table
        raise NotImplementedError

    def reset(self, sid: int, code: int) -> None:  # Connection: RST_STREAM
        raise NotImplementedError

    # ---- replies -------------------------------------------------------------------------------------------
    def send_data(self, stream: ServerStream, data: bytes) -> None:
        if stream.closed or self.transport is None:
            return
        out = self._out
        sid = stream.id
        if not stream.started:
            stream.started = True
            out.append(_header(_RESPONSE_HEADERS_LEN, HEADERS, END_HEADERS, sid) + RESPONSE_HEADERS)
        n = len(data)
        if (stream.pending is None and not self._write_paused and n <= self._max_out_frame
                and n <= self._send_window and n <= self._peer_initial + stream.send_delta):
            out.append(_header(n, DATA, 0, sid))
            out.append(data)
            stream.send_delta -= n
            self._send_window -= n
            self.budget.data_frames_sent += 1
        else:
            if stream.pending is None:
                stream.pending = deque()
            stream.pending.append(memoryview(data))
            stream.pending_bytes += n
            self.out_pending += n
            self.server.buffered += n
            if len(stream.pending) == 1:
                self._drain(stream)
        self._written()

    def send_headers(self, stream: ServerStream, metadata: list[tuple[bytes, bytes]]) -> None:
        if stream.closed or self.transport is None:
            return
        stream.started = True
        self._headers(stream.id, RESPONSE_HEADERS + frames.encode_fields(metadata), False)
        self._written()

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
            self._closed_locally(stream)
        elif stream.pending is not None:
            stream.trailers = block
        else:
            self._headers(stream.id, block, True)
            self._closed_locally(stream)
        self._written()

    def reply_status(self, stream: ServerStream, http_status: int) -> None:
        """A plain HTTP response with no body (a request that is not gRPC)."""
        stream.started = True
        self._headers(stream.id, frames.status_only(http_status), True)
        self._closed_locally(stream)
        self._written()

    def _headers(self, sid: int, block: bytes, end_stream: bool) -> None:
        self._out += frames.headers(sid, block, end_stream, self._max_out_frame)

    def _closed_locally(self, stream: ServerStream) -> None:
        """Our side is done. If the client still sends, tell it to stop (RST_STREAM NO_ERROR, as grpc does)."""
        if not stream.remote_ended:
            self.reset(stream.id, NO_ERROR)
        stream.closed = True
        self._remove(stream)

    # ---- flow control, sending -------------------------------------------------------------------------------
    def _drain(self, stream: ServerStream) -> None:
        """Send what waits on the stream, as far as the windows and the socket allow."""
        pending = stream.pending
        if pending is None:
            return
        out = self._out
        sid = stream.id
        budget = self.budget
        sent = 0
        while pending:
            if self._write_paused or self._send_window <= 0:
                self._waiting_stream.pop(stream, None)
                self._waiting_conn[stream] = None
                break
            window = self._peer_initial + stream.send_delta
            if window <= 0:
                self._waiting_conn.pop(stream, None)
                self._waiting_stream[stream] = None
                break
            head = pending[0]
            n = min(window, self._send_window, self._max_out_frame, len(head))
            if n == len(head):
                pending.popleft()
            else:
                pending[0] = head[n:]
                head = head[:n]
            out.append(_header(n, DATA, 0, sid))
            out.append(head)
            stream.send_delta -= n
            self._send_window -= n
            sent += n
            budget.data_frames_sent += 1
        stream.pending_bytes -= sent
        self.out_pending -= sent
        self.server.buffered -= sent
        if pending:
            if sent:
                self._written()
            return
        stream.pending = None
        self._waiting_conn.pop(stream, None)
        self._waiting_stream.pop(stream, None)
        if stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._headers(sid, block, True)
            self._closed_locally(stream)
        else:
            self.window_may_open(stream)
        self._written()
        self._wake_writers()

    def _drain_waiting(self) -> None:
        """The connection window opened or the socket drained: streams waiting for it go, in arrival order."""
        waiting = self._waiting_conn
        while waiting and self._send_window > 0 and not self._write_paused and self.transport is not None:
            stream = next(iter(waiting))
            del waiting[stream]
            self._drain(stream)

    def _initial_window_changed(self, delta: int) -> None:
        if delta > 0:
            for stream in list(self._waiting_stream):
                if self._peer_initial + stream.send_delta > 0:
                    del self._waiting_stream[stream]
                    self._drain(stream)

    # ---- flow control, receiving -----------------------------------------------------------------------------
    def window_may_open(self, stream: ServerStream) -> None:
        """Give the stream's window back if half of it is used and the stream does not hold too much."""
        unacked = stream.unacked
        if (unacked >= self.limits.initial_stream_window >> 1 and not stream.remote_ended and not stream.closed
                and stream.pending_bytes + stream.held <= self.limits.max_stream_buffer_bytes):
            stream.unacked = 0
            stream.recv_window += unacked
            self._out.append(frames.window_update(stream.id, unacked))
            self._written()

    def _connection_window(self) -> None:
        """Give the connection's window back once half of it is used, unless the connection holds more than its
        budget; while the whole server holds more than its own, a connection gets no more than its share."""
        lim = self.limits
        grant = self._conn_unacked
        if grant < lim.initial_connection_window >> 1:
            return
        own = self.out_pending + self.held
        if own > lim.max_connection_buffer_bytes:
            return
        server = self.server
        if server.buffered > lim.max_server_buffer_bytes:
            grant = min(grant, lim.max_server_buffer_bytes // max(1, len(server.connections)) - own)
            if grant <= 0:
                return
        self._conn_unacked -= grant
        self._recv_window += grant
        self._out.append(frames.window_update(0, grant))

    def reserve(self, stream: ServerStream, nbytes: int) -> bool:
        """Room for a message of `nbytes` being assembled on `stream`: within the connection's budget (or the only
        message it assembles) and within the server's."""
        lim = self.limits
        if (self.reserved and self.reserved + self.out_pending + self.held + nbytes > lim.max_connection_buffer_bytes
                or self.server.buffered + nbytes > lim.max_server_buffer_bytes):
            return False
        self.reserved += nbytes
        self.server.buffered += nbytes
        stream.reserved = nbytes
        return True

    def unreserve(self, stream: ServerStream) -> None:
        self.reserved -= stream.reserved
        self.server.buffered -= stream.reserved
        stream.reserved = 0

    def note_held(self, nbytes: int) -> None:
        self.held += nbytes
        self.server.buffered += nbytes

    # ---- writing -------------------------------------------------------------------------------------------
    def pending_bytes(self, stream: ServerStream) -> int:
        return stream.pending_bytes

    async def writable(self, stream: ServerStream, limit: int = 1 << 20) -> None:
        """Wait while more than `limit` bytes wait on this stream's window or the socket is paused."""
        while self.transport is not None and not stream.closed and (
                self._write_paused or stream.pending_bytes > limit):
            if self._drained is None or self._drained.done():
                self._drained = self.loop.create_future()
            await self._drained

    def _wake_writers(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _written(self) -> None:
        if not self._receiving and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._conn_unacked:
            self._connection_window()
        out = self._out
        if out:
            self._out = []
            if self.transport is not None:
                self.transport.writelines(out)

"""One HTTP/2 connection of the gRPC server: an asyncio Protocol around an h2 state machine.

- Reading: every `data_received` feeds h2 and dispatches its events; request bodies go to the streams, which hand
  complete messages to their handlers synchronously. Received data is acknowledged at once (h2 batches the
  WINDOW_UPDATEs); what a handler buffers is bounded by the message size limit.
- Writing is coalesced: replies produced while a batch of frames is handled go out in one write at the end of
  `data_received`; replies produced elsewhere (a task, a timer) schedule one flush for the current loop iteration.
- Outbound flow control: data beyond the peer's window waits on the stream (trailers behind it) until a
  WINDOW_UPDATE or a SETTINGS change opens the window.
- A client GOAWAY lets the streams it already opened finish (RFC 9113 §6.8); h2 would close the connection state
  at once, so the state is put back to open for them. A server stop sends its own GOAWAY, refuses new streams
  and lets the open ones finish within the grace period.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame, RstStreamFrame

from epp.h2grpc import status
from epp.h2grpc.stream import ServerStream

if TYPE_CHECKING:
    from epp.h2grpc.server import H2Server

log = logging.getLogger(__name__)

_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding=None, validate_inbound_headers=False, validate_outbound_headers=False,
    normalize_inbound_headers=False, normalize_outbound_headers=False)
WINDOW = 4 << 20  # per stream and per connection: acknowledged as soon as it is read
MAX_STREAMS = 2**31 - 1  # as grpc: no limit of our own on concurrent streams
# Replies are never compressed; requests may be (epp/h2grpc/stream.py inflates gzip and deflate).
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                     (b"grpc-accept-encoding", b"identity,deflate,gzip")]


class _H2Connection(h2.connection.H2Connection):
    """h2's connection without one cost: h2 4.x computes `repr(frame)` for a trace log line on every received
    frame, even with no logger, and a DATA frame's repr hexlifies its whole payload (6% of Pointsman's CPU with
    16 KB bodies). This is h2's `_receive_frame` with that line left out; everything else is unchanged."""

    def _receive_frame(self, frame: Any) -> list[h2.events.Event]:
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as e:
            # Closed by RST_STREAM: answer with RST_STREAM; otherwise a connection error.
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except h2.exceptions.StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise h2.exceptions.StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events


def _peer(transport: asyncio.BaseTransport) -> str:
    addr = transport.get_extra_info("peername")
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{addr}" if addr else "unknown"


class Connection(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.h2 = _H2Connection(_CONFIG)
        self.streams: dict[int, ServerStream] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.loop = asyncio.get_running_loop()
        self.going_away = False  # our GOAWAY is sent: no new streams
        self.last_stream = 0
        self._receiving = False
        self._flush_scheduled = False
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._dispatch: dict[type, Any] = {
            h2.events.RequestReceived: self._request,
            h2.events.DataReceived: self._data,
            h2.events.StreamEnded: self._ended,
            h2.events.StreamReset: self._reset,
            h2.events.WindowUpdated: self._window,
            h2.events.RemoteSettingsChanged: self._settings,
            h2.events.ConnectionTerminated: self._terminated,
            h2.events.TrailersReceived: self._trailers,
        }

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes
        self.peer = _peer(transport)
        self.server.connections.add(self)
        c = self.h2
        c.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
        })
        c.initiate_connection()
        c.increment_flow_control_window(WINDOW)
        self.transport.write(c.data_to_send())

    def data_received(self, data: bytes) -> None:
        self._receiving = True
        try:
            events = self.h2.receive_data(data)
            dispatch = self._dispatch
            for ev in events:
                handler = dispatch.get(type(ev))
                if handler is not None:
                    handler(ev)
        except h2.exceptions.ProtocolError as e:
            log.debug("HTTP/2 protocol error from %s: %s", self.peer, e)
            self._flush()
            self._abort()
            return
        finally:
            self._receiving = False
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        streams, self.streams = self.streams, {}
        for s in streams.values():
            s.lost()
        self.transport = None
        self._wake_writers()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    # ---- events ------------------------------------------------------------------------------------------
    def _request(self, ev: h2.events.RequestReceived) -> None:
        sid = ev.stream_id
        if self.going_away:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        headers = ev.headers
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
        self.streams[sid] = stream
        self.last_stream = sid
        if method != b"POST" or ctype is None or not ctype.startswith(b"application/grpc"):
            stream.remote_ended = ev.stream_ended is not None
            stream.started = True
            self.h2.send_headers(sid, [(b":status", b"405" if method != b"POST" else b"415")], end_stream=True)
            self._closed_locally(stream)
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
            stream.finish(status.INTERNAL, f"cannot start the call: {e}")

    def _data(self, ev: h2.events.DataReceived) -> None:
        sid = ev.stream_id
        if ev.flow_controlled_length:
            self.h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        stream = self.streams.get(sid)
        if stream is not None and stream.handler is not None:
            try:
                stream.feed(ev.data)
            except Exception as e:  # a handler bug ends its call, never the connection
                self._handler_failed(stream, e)

    def _ended(self, ev: h2.events.StreamEnded) -> None:
        stream = self.streams.get(ev.stream_id)
        if stream is None:
            return
        try:
            stream.end()
        except Exception as e:
            self._handler_failed(stream, e)

    def _handler_failed(self, stream: ServerStream, error: Exception) -> None:
        log.error("%s: handler failed", stream.path, exc_info=error)
        try:
            stream.fail(status.INTERNAL, f"handler failed: {error}")
        except Exception:
            log.exception("%s: the handler failed again while cancelling", stream.path)

    def _trailers(self, ev: h2.events.TrailersReceived) -> None:
        pass  # request trailers carry nothing for gRPC; StreamEnded follows

    def _reset(self, ev: h2.events.StreamReset) -> None:
        stream = self.streams.pop(ev.stream_id, None)
        if stream is not None:
            stream.lost()

    def _window(self, ev: h2.events.WindowUpdated) -> None:
        if ev.stream_id:
            stream = self.streams.get(ev.stream_id)
            if stream is not None and stream.pending:
                try:
                    self._drain(stream)
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as e:
                    self._unsendable(stream, e)
        else:
            self._drain_all()

    def _settings(self, ev: h2.events.RemoteSettingsChanged) -> None:
        self._drain_all()

    def _terminated(self, ev: h2.events.ConnectionTerminated) -> None:
        if ev.error_code == ErrorCodes.NO_ERROR and self.streams:
            # The peer opens no more streams; the ones it opened may finish. h2 closed its state machine.
            self.h2.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
            self.going_away = True
            return
        self._abort()

    # ---- sending -------------------------------------------------------------------------------------------
    def send_data(self, stream: ServerStream, data: bytes) -> None:
        c = self.h2
        try:
            if not stream.started:
                stream.started = True
                c.send_headers(stream.id, _RESPONSE_HEADERS)
            if stream.pending is not None:
                stream.pending.append(memoryview(data))
            elif len(data) <= c.max_outbound_frame_size and len(data) <= c.local_flow_control_window(stream.id):
                c.send_data(stream.id, data)
            else:
                stream.pending = [memoryview(data)]
                self._drain(stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as e:
            self._unsendable(stream, e)
            return
        self._written()

    def send_headers(self, stream: ServerStream, metadata: list[tuple[bytes, bytes]]) -> None:
        try:
            stream.started = True
            self.h2.send_headers(stream.id, _RESPONSE_HEADERS + metadata)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as e:
            self._unsendable(stream, e)
            return
        self._written()

    def send_trailers(self, stream: ServerStream, trailers: list[tuple[bytes, bytes]]) -> None:
        if stream.closed:
            return
        try:
            if not stream.started:  # trailers-only response
                stream.started = True
                self.h2.send_headers(stream.id, _RESPONSE_HEADERS + trailers, end_stream=True)
                self._closed_locally(stream)
            elif stream.pending is not None:
                stream.trailers = trailers
            else:
                self.h2.send_headers(stream.id, trailers, end_stream=True)
                self._closed_locally(stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as e:
            self._unsendable(stream, e)
            return
        self._written()

    def _unsendable(self, stream: ServerStream, error: Exception) -> None:
        """h2 refused to send on this stream (it is gone, or the connection is closing)."""
        log.debug("stream %d of %s: cannot send: %s", stream.id, self.peer, error)
        self.streams.pop(stream.id, None)
        stream.lost()

    def _closed_locally(self, stream: ServerStream) -> None:
        """Our side is done. If the client still sends, tell it to stop (RST_STREAM NO_ERROR, as grpc does)."""
        if not stream.remote_ended:
            try:
                self.h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
            except h2.exceptions.StreamClosedError:
                pass
        self.streams.pop(stream.id, None)
        stream.closed = True

    def _drain(self, stream: ServerStream) -> None:
        c = self.h2
        pending = stream.pending
        sid = stream.id
        while pending:
            window = c.local_flow_control_window(sid)
            if window <= 0:
                return
            head = pending[0]
            n = min(window, c.max_outbound_frame_size, len(head))
            c.send_data(sid, head[:n])
            if n == len(head):
                pending.pop(0)
            else:
                pending[0] = head[n:]  # a memoryview: no copy of the rest
        stream.pending = None
        if stream.trailers is not None:
            trailers, stream.trailers = stream.trailers, None
            c.send_headers(sid, trailers, end_stream=True)
            self._closed_locally(stream)
        self._written()
        self._wake_writers()

    def _drain_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.pending:
                try:
                    self._drain(stream)
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as e:
                    self._unsendable(stream, e)

    def pending_bytes(self, stream: ServerStream) -> int:
        return sum(map(len, stream.pending)) if stream.pending else 0

    async def writable(self, stream: ServerStream, limit: int = 1 << 20) -> None:
        """Wait while more than `limit` bytes wait on this stream's window or the socket is paused."""
        while self.transport is not None and not stream.closed and (
                self._paused or self.pending_bytes(stream) > limit):
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
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    # ---- shutdown ------------------------------------------------------------------------------------------
    def goaway(self) -> None:
        """Graceful: GOAWAY(NO_ERROR), refuse new streams, let the open ones finish."""
        if self.going_away or self.transport is None:
            self.going_away = True
            return
        self.going_away = True
        self._flush()
        frame = GoAwayFrame(0, last_stream_id=self.last_stream, error_code=0)
        self.transport.write(frame.serialize())

    def cancel_all(self) -> None:
        """Stop now: every open call is cancelled and reset, then the connection closes."""
        for stream in list(self.streams.values()):
            if not stream.closed:
                try:
                    self.h2.reset_stream(stream.id, ErrorCodes.CANCEL)
                except h2.exceptions.StreamClosedError:
                    pass
            stream.lost()
        self.streams.clear()
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.close()

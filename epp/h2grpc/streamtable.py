"""The open streams of a connection (RFC 9113 §5.1, the server's side): mixed into Connection.

- A stream enters the table from its header block (`_open`): the method and content type are checked, the path
  routed, its grpc-timeout armed, its handler made. The dict's size is the open-stream count (O(1)).
- It leaves (`_remove`) when it is closed both ways or reset; its queued replies, held requests and reservations
  leave the connection's and the server's buffer counts with it. Reset by either side, or the connection gone,
  its call is cancelled (`_forget`).
- Resets from us (`reset`) are remembered for the last few thousand streams, so that frames the client sent
  before it learned of one are ignored. A client's error on one stream resets it and counts as a premature reset
  (budget.py), as does a stream we refuse.
- A handler's exception ends its call (INTERNAL), never the connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from epp.h2grpc import frames, status
from epp.h2grpc.frames import END_STREAM, ENHANCE_YOUR_CALM, H2Error
from epp.h2grpc.outbound import Outbound
from epp.h2grpc.stream import ServerStream

if TYPE_CHECKING:
    from epp.h2grpc.connection import Connection

log = logging.getLogger("epp.h2grpc.connection")


class StreamTable(Outbound):
    # set up by Connection.__init__ (besides what Outbound declares)
    _reset_ids: dict[int, None]  # streams we reset lately, oldest first
    _reset_memory: int  # how many of those are remembered

    def _became_idle(self) -> None:  # Connection: the last stream left
        raise NotImplementedError

    # ---- entering --------------------------------------------------------------------------------------------
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

    # ---- resets ----------------------------------------------------------------------------------------------
    def reset(self, sid: int, code: int) -> None:
        """RST_STREAM from us. Frames the client sent before it learns of it are ignored, for the last few
        thousand streams reset; on other closed streams they are connection errors (RFC 9113 §5.1)."""
        self._out.append(frames.rst_stream(sid, code))
        reset = self._reset_ids
        reset[sid] = None
        if len(reset) > self._reset_memory:
            del reset[next(iter(reset))]

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

    # ---- leaving ---------------------------------------------------------------------------------------------
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

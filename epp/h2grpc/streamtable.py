"""The open streams of a connection (RFC 9113 §5.1, the server's side).

- A stream enters the table from its header block (`headers`): the method and content type are checked, the path
  routed, its grpc-timeout armed, its handler made. The dict's size is the open-stream count (O(1)). Client stream
  ids only grow, so anything at or below the highest seen and not in the table is closed. Beyond
  SETTINGS_MAX_CONCURRENT_STREAMS, or once the connection is going away, a new stream gets RST_STREAM
  REFUSED_STREAM.
- It leaves (`remove`) when it is closed both ways or reset; its queued replies (`Outbound.drop`), held requests
  and reservations (`ReceiveWindows.drop`) leave the connection's and the server's buffer counts with it. Reset
  by either side, or the connection gone, its call is cancelled (`forget`).
- Resets from us (`reset`) are remembered for the last few thousand streams, so that frames the client sent
  before it learned of one are ignored. A client's error on one stream resets it and counts as a premature reset
  (budget.py), as does a stream we refuse.
- The connection hears of the table going from empty to busy and back (`Connection.busy`, `became_idle`): idle
  timers, the server's list of idle connections, closing after GOAWAY.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from epp.h2grpc import frames, status
from epp.h2grpc.frames import (
    END_STREAM,
    ENHANCE_YOUR_CALM,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2Error,
)
from epp.h2grpc.stream import ServerStream

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.connection import Connection
    from epp.h2grpc.outbound import Outbound
    from epp.h2grpc.server import H2Server
    from epp.h2grpc.windows import ReceiveWindows

log = logging.getLogger("epp.h2grpc.connection")


class StreamTable:
    __slots__ = ("conn", "server", "limits", "loop", "budget", "out", "windows", "streams", "last_stream",
                 "going_away", "_reset_ids", "_reset_memory")

    def __init__(self, conn: Connection, out: Outbound, windows: ReceiveWindows, budget: Budget,
                 loop: asyncio.AbstractEventLoop) -> None:
        server: H2Server = conn.server
        self.conn = conn  # the streams' connection; told when the table becomes busy and idle
        self.server = server
        self.limits = lim = server.limits
        self.loop = loop
        self.budget = budget
        self.out = out
        self.windows = windows
        self.streams: dict[int, ServerStream] = {}  # the open ones, by id
        self.last_stream = 0  # the highest client stream id seen
        self.going_away = False  # the final GOAWAY is sent, or the client sent one: no new streams
        self._reset_ids: dict[int, None] = {}  # streams we reset lately, oldest first
        self._reset_memory = max(4096, 2 * lim.max_concurrent_streams)  # how many of those are remembered

    # ---- entering --------------------------------------------------------------------------------------------
    def headers(self, sid: int, flags: int, headers: list[tuple[bytes, bytes]], self_dependent: bool) -> None:
        """A decoded header block: a new stream, or trailers of an open one."""
        stream = self.streams.get(sid)
        if stream is not None:  # trailers: carry nothing for gRPC
            if stream.remote_ended:
                self.stream_error(stream, STREAM_CLOSED)
            elif not flags & END_STREAM or self_dependent:
                self.stream_error(stream, PROTOCOL_ERROR)
            else:
                self.end_stream(stream)
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
            self.refuse(sid, PROTOCOL_ERROR)
        elif self.going_away or len(self.streams) >= self.limits.max_concurrent_streams:
            self.refuse(sid, REFUSED_STREAM)
        else:
            self._open(sid, flags, headers)

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
        stream = ServerStream(self.conn, self.out, sid, (path or b"").decode("latin-1"), headers)
        stream.recv_window = self.limits.initial_stream_window
        stream.opened_at = self.loop.time()
        if not self.streams:
            self.conn.busy()
        self.streams[sid] = stream
        if flags & END_STREAM:
            stream.remote_ended = True
        if method != b"POST" or ctype is None or not ctype.startswith(b"application/grpc"):
            self.out.reply_status(stream, 405 if method != b"POST" else 415)
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
            self.end_stream(stream)

    def end_stream(self, stream: ServerStream) -> None:
        """The client half-closed the stream."""
        try:
            stream.end()
        except Exception as e:
            stream.handler_failed(e)

    def was_reset(self, sid: int) -> bool:
        """A closed stream we reset lately: frames the client sent before it learned of it are ignored."""
        return sid in self._reset_ids

    # ---- resets ----------------------------------------------------------------------------------------------
    def reset(self, sid: int, code: int) -> None:
        """RST_STREAM from us. Frames the client sent before it learns of it are ignored, for the last few
        thousand streams reset; on other closed streams they are connection errors (RFC 9113 §5.1)."""
        self.out.send_frame(frames.rst_stream(sid, code))
        reset = self._reset_ids
        reset[sid] = None
        if len(reset) > self._reset_memory:
            del reset[next(iter(reset))]

    def stream_error(self, stream: ServerStream, code: int) -> None:
        """A client's error on one stream: RST_STREAM; the call is cancelled; it counts as a premature reset."""
        self.reset(stream.id, code)
        self.forget(stream)
        self.premature()

    def refuse(self, sid: int, code: int) -> None:
        self.reset(sid, code)
        self.premature()

    def premature(self) -> None:
        if why := self.budget.premature_reset():
            raise H2Error(ENHANCE_YOUR_CALM, why)

    # ---- leaving ---------------------------------------------------------------------------------------------
    def closed_locally(self, stream: ServerStream) -> None:
        """Our side is done. If the client still sends, tell it to stop (RST_STREAM NO_ERROR, as grpc does)."""
        if not stream.remote_ended:
            self.reset(stream.id, frames.NO_ERROR)
        stream.closed = True
        self.remove(stream)

    def remove(self, stream: ServerStream) -> None:
        """The stream leaves the table (closed both ways, or reset); its buffers leave the connection's budget."""
        if self.streams.pop(stream.id, None) is None:
            return
        if stream.pending is not None:  # only a stream with replies queued waits for a window
            self.out.drop(stream)
        if stream.reserved or stream.held:
            self.windows.drop(stream)
        if not self.streams:
            self.conn.became_idle()

    def forget(self, stream: ServerStream) -> None:
        """Reset, by either side, or the connection is gone: the call is cancelled."""
        self.remove(stream)
        stream.lost()

    def cancel_all(self) -> None:
        """Every open call is cancelled and reset (RST_STREAM CANCEL)."""
        for stream in list(self.streams.values()):
            if not stream.closed:
                self.reset(stream.id, frames.CANCEL)
            self.forget(stream)

    def lost(self) -> None:
        """The connection is gone: every open call is cancelled."""
        for stream in list(self.streams.values()):
            self.forget(stream)

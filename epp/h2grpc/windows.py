"""What a client may send on a connection: our receive windows, and the buffer budgets that hold them back.

- A stream's window is given back (WINDOW_UPDATE) once half of it is used, unless the replies queued on it (and
  what its handler holds unread) exceed `max_stream_buffer_bytes`; the connection's window likewise, unless the
  connection holds more than `max_connection_buffer_bytes`. A client that does not read its replies therefore
  stops being able to send.
- The bytes a connection holds are counted here and in the server's total (`H2Server.buffered`): messages being
  assembled (`reserve`), request bytes handlers keep unread (`note_held`); the replies queued are `Outbound`'s
  (outbound.py), passed in where the budget is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.h2grpc import frames
from epp.h2grpc.frames import FLOW_CONTROL_ERROR, H2Error

if TYPE_CHECKING:
    from epp.h2grpc.outbound import Outbound
    from epp.h2grpc.server import H2Server
    from epp.h2grpc.stream import ServerStream


class ReceiveWindows:
    __slots__ = ("limits", "server", "out", "recv_window", "conn_unacked", "held", "reserved")

    def __init__(self, server: H2Server, out: Outbound) -> None:
        lim = server.limits
        self.limits = lim
        self.server = server
        self.out = out  # WINDOW_UPDATEs go with its next flush; its queued replies count against the budget
        self.recv_window = frames.DEFAULT_WINDOW  # what the client may still send on the connection
        self.conn_unacked = lim.initial_connection_window - frames.DEFAULT_WINDOW  # granted at the first flush
        self.held = 0  # bytes handlers hold unread
        self.reserved = 0  # bytes reserved for messages being assembled

    def received(self, n: int) -> None:
        """`n` bytes of DATA (padding included) arrived on the connection."""
        self.recv_window -= n
        if self.recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "the connection's window was overrun")
        self.conn_unacked += n

    def window_may_open(self, stream: ServerStream) -> None:
        """Give the stream's window back if half of it is used and the stream does not hold too much."""
        unacked = stream.unacked
        lim = self.limits
        if (unacked >= lim.initial_stream_window >> 1 and not stream.remote_ended and not stream.closed
                and stream.pending_bytes + stream.held <= lim.max_stream_buffer_bytes):
            stream.unacked = 0
            stream.recv_window += unacked
            out = self.out
            out.send_frame(frames.window_update(stream.id, unacked))
            out.written()

    def connection_grant(self, out_pending: int) -> bytes | None:
        """The connection's WINDOW_UPDATE, once half of its window is used, unless the connection holds more than
        its budget (`out_pending`: the replies queued on it); while the whole server holds more than its own, a
        connection gets no more than its share."""
        lim = self.limits
        grant = self.conn_unacked
        if grant < lim.initial_connection_window >> 1:
            return None
        own = out_pending + self.held
        if own > lim.max_connection_buffer_bytes:
            return None
        server = self.server
        if server.buffered > lim.max_server_buffer_bytes:
            grant = min(grant, lim.max_server_buffer_bytes // max(1, len(server.connections)) - own)
            if grant <= 0:
                return None
        self.conn_unacked -= grant
        self.recv_window += grant
        return frames.window_update(0, grant)

    def reserve(self, stream: ServerStream, nbytes: int) -> bool:
        """Room for a message of `nbytes` being assembled on `stream`: within the connection's budget (or the only
        message it assembles) and within the server's."""
        lim = self.limits
        if (self.reserved and self.reserved + self.out.out_pending + self.held + nbytes
                > lim.max_connection_buffer_bytes or self.server.buffered + nbytes > lim.max_server_buffer_bytes):
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

    def drop(self, stream: ServerStream) -> None:
        """The stream left the table: its reservation and what its handler held leave the counts."""
        if stream.reserved:
            self.unreserve(stream)
        if stream.held:
            self.held -= stream.held
            self.server.buffered -= stream.held
            stream.held = 0

"""ext_proc on the h2 transport: one callback-driven call per Envoy stream, with no task of its own.

Every complete ProcessingRequest goes to the stream's `StreamSession` (epp/extproc/session.py: the rules both
transports share); its replies are queued on the stream and leave with the other replies of the same read (one
write per read, see epp/h2grpc/connection.py).

A request body message of RAW_BODY_MIN bytes or more is read from the wire without protobuf (epp.protocol.rawbody; a
shorter one is parsed like the other messages): its chunk stays a view of the message, and its full-duplex echo goes
out as the parts of a `RawReply` (a small envelope and that view), framed by the HTTP/2 layer without joining them:
a forwarded body is copied once on its way in (into its message) and once on its way out (the socket write),
whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from epp.extproc.session import ProtocolMetrics, Replies, StreamConfig, StreamSession
from epp.h2grpc import ServerStream, status
from epp.protocol import RawReply, read_request_body

if TYPE_CHECKING:
    from epp.request import Director

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_parse = pb.ProcessingRequest.FromString
# A body message shorter than this is parsed by protobuf: reading the wire format in Python costs more than the
# copies it saves (120 B: about 2 µs more when buffered, the same when echoed; the echo gains from a few KB on).
RAW_BODY_MIN = 8192


class ExtProcH2:
    """The ext_proc service on the h2 transport (`director` may be swapped; new streams use the new one)."""

    def __init__(self, director: Director, config: StreamConfig, metrics: ProtocolMetrics | None = None) -> None:
        self.director = director
        self.config = config
        self.metrics = metrics

    def call(self, stream: ServerStream) -> ExtProcCall:
        return ExtProcCall(self, stream)


class ExtProcCall:
    """The h2 stream handler (epp.h2grpc.StreamHandler) around one session.

    The session's callbacks hold the stream, never this call: a bound method of the call would close a reference
    cycle (call -> session -> method -> call) that refcounting cannot free, so every finished stream's objects
    (the session, the exchange, its request, its scheduling result: about 46 tracked objects) would wait for the
    cyclic GC. With thousands of long-lived streams those objects reach the oldest generation first, and the full
    collections that free them walk every live stream: CPU per request that grows with the streams held open
    (docs/performance.md, "The front door"). The stream drops its handler when the call ends, so nothing cycles.
    """

    __slots__ = ("stream", "session")

    def __init__(self, service: ExtProcH2, stream: ServerStream) -> None:
        self.stream = stream
        self.session = StreamSession(service.director, service.config, service.metrics, _sender(stream),
                                     stream.finish, stream.headers)

    def on_message(self, data: bytes) -> None:
        if data[:1] == b"\x22" and len(data) >= RAW_BODY_MIN:  # request_body first: most likely a body chunk
            chunk = read_request_body(data)
            if chunk is not None:
                self.session.body(chunk)
                return
        try:
            req = _parse(data)
        except DecodeError as e:
            self.session.cancelled()
            self.stream.finish(status.INTERNAL, f"Exception deserializing request! {e}")
            return
        self.session.message(req)

    def on_end(self) -> None:
        self.session.input_ended()

    def on_cancel(self) -> None:
        self.session.cancelled()



def _sender(stream: ServerStream) -> Callable[[Replies], None]:
    send_many = stream.send_many
    send_parts = stream.send_parts
    frame = status.frame

    def send(replies: Replies) -> None:
        for r in replies:
            if r.__class__ is RawReply:
                break
        else:  # protobuf messages only
            send_many([r.SerializeToString() for r in replies])
            return
        parts: list[bytes | memoryview] = []
        for r in replies:
            if r.__class__ is RawReply:
                parts += r.parts
            else:
                parts.append(frame(r.SerializeToString()))
        send_parts(parts)

    return send

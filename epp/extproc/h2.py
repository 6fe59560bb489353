"""ext_proc on the h2 transport: one callback-driven call per Envoy stream, with no task of its own.

Every complete ProcessingRequest goes to the stream's `StreamSession` (epp/extproc/session.py: the rules both
transports share); its replies are queued on the stream and leave with the other replies of the same read (one
write per read, see epp/h2grpc/connection.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from epp.extproc.session import ProtocolMetrics, Replies, StreamConfig, StreamSession
from epp.h2grpc import ServerStream, status

if TYPE_CHECKING:
    from epp.request.director import Director

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_parse = pb.ProcessingRequest.FromString


class ExtProcH2:
    """The ext_proc service on the h2 transport (`director` may be swapped; new streams use the new one)."""

    def __init__(self, director: Director, config: StreamConfig, metrics: ProtocolMetrics | None = None) -> None:
        self.director = director
        self.config = config
        self.metrics = metrics

    def call(self, stream: ServerStream) -> ExtProcCall:
        return ExtProcCall(self, stream)


class ExtProcCall:
    """The h2 stream handler (epp.h2grpc.StreamHandler) around one session."""

    __slots__ = ("stream", "session")

    def __init__(self, service: ExtProcH2, stream: ServerStream) -> None:
        self.stream = stream
        self.session = StreamSession(service.director, service.config, service.metrics, self._send, self._finish,
                                     stream.headers)

    def on_message(self, data: bytes) -> None:
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

    def _send(self, replies: Replies) -> None:
        self.stream.send_many([r.SerializeToString() for r in replies])

    def _finish(self) -> None:
        self.stream.finish(status.OK)

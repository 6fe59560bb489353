"""ext_proc on grpc.aio (`--grpc-transport grpcio`): one task per stream around a `StreamSession`.

The session (epp/extproc/session.py) holds the rules both transports share; here a reader task feeds it the
stream's messages while the servicer writes the replies it queues, in order, and returns (OK status) when the
session finishes the call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc.session import ProtocolMetrics, Replies, StreamConfig, StreamSession

if TYPE_CHECKING:
    from epp.request import Director

log = logging.getLogger("epp.extproc")
_EOF = grpc.aio.EOF


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    """`director` may be swapped (a reload); new streams use the new one."""

    def __init__(self, director: Director, config: StreamConfig, metrics: ProtocolMetrics | None = None) -> None:
        self.director = director
        self.config = config
        self.metrics = metrics

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        out: asyncio.Queue[Replies | None] = asyncio.Queue()
        director = self.director
        md = context.invocation_metadata() if getattr(director, "tracing", None) is not None else None  # Envoy's trace context
        session = StreamSession(director, self.config, self.metrics, out.put_nowait,
                                lambda: out.put_nowait(None), md)
        reader = asyncio.ensure_future(_read(context, session, out))
        try:
            while (replies := await out.get()) is not None:
                for reply in replies:
                    await context.write(reply)
        finally:
            reader.cancel()
            session.cancelled()  # a no-op once the session finished the call


async def _read(context: grpc.aio.ServicerContext, session: StreamSession, out: asyncio.Queue[Replies | None]
                ) -> None:
    try:
        while True:
            req = await context.read()
            if req is _EOF:
                session.input_ended()
                return
            session.message(req)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the stream broke under the reader: end the call
        log.debug("ext_proc stream read failed: %r", exc)
        session.cancelled()
        out.put_nowait(None)

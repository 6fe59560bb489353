"""The thin gRPC layer: ext_proc streams in, protocol machine replies out; plus Pointsman's own API.

Per stream it drives one `RequestMachine` and one director exchange:
- When the machine needs a decision it asks the exchange. An `Outcome` returned synchronously is used at once
  (the fast path: no task is created). An awaitable is awaited while the stream is still read, so messages that
  arrive meanwhile reach the machine in order, and the stream ending or being cancelled cancels the decision at once.
- Every stream ends with exactly one `exchange.close()`, whether it finished, violated the protocol, was cancelled
  by Envoy, or broke. With a decision still running, close() runs once that cancelled task has settled, so
  anything it committed is released.
- A bug inside the machine or the exchange becomes an ImmediateResponse 500 on that stream, never a crashed server
  or a hung stream. Protocol violations are counted by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.director import Director
from epp.explain import PointsmanService
from epp.h2grpc.limits import ServerLimits, grpcio_options
from epp.protocol import BodyMode, Exchange, Outcome, Phase, RequestMachine, immediate
from proto import pointsman_pb2_grpc

log = logging.getLogger(__name__)

_EOF = grpc.aio.EOF


@dataclass(slots=True)
class StreamConfig:
    request_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    max_body_bytes: int = 64 * 1024 * 1024


class ProtocolMetrics(Protocol):
    """What the ext_proc layer reports (epp.metrics.EppMetrics implements it)."""

    def protocol_violation(self, kind: str) -> None: ...


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self, director: Director, config: StreamConfig | None = None, metrics: ProtocolMetrics | None = None
    ) -> None:
        self.director = director
        self.config = config or StreamConfig()
        self.metrics = metrics

    async def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        cfg = self.config
        exchange = self.director.exchange()
        machine = RequestMachine(
            exchange,
            request_body_mode=cfg.request_body_mode,
            response_body_mode=cfg.response_body_mode,
            max_body_bytes=cfg.max_body_bytes,
        )
        stream = _Stream(machine, exchange, context)
        try:
            await stream.run()
        finally:
            stream.finish()
            if machine.violation is not None:
                log.debug("ext_proc protocol violation: %s", machine.violation)
                if self.metrics is not None:
                    self.metrics.protocol_violation(machine.violation)


class _Stream:
    """One ext_proc stream: reads, feeds the machine, settles decisions, writes replies."""

    __slots__ = ("machine", "exchange", "context", "reading", "deciding")

    def __init__(self, machine: RequestMachine, exchange: Exchange, context: grpc.aio.ServicerContext) -> None:
        self.machine = machine
        self.exchange = exchange
        self.context = context
        self.reading: asyncio.Future[Any] | None = None  # a read left running by the slow path
        self.deciding: asyncio.Future[Outcome] | None = None  # an awaitable decision in progress

    async def run(self) -> None:
        machine, context = self.machine, self.context
        try:
            while True:
                if self.reading is None:
                    req = await context.read()
                else:
                    req = await self.reading
                    self.reading = None
                if req is _EOF:
                    return
                replies = machine.feed(req)
                d = machine.decision  # set while the machine is DECIDING; asked here once, right after it is set
                if d is not None:
                    result = self.exchange.decide(d.headers, d.body, d.metadata)
                    if isinstance(result, Outcome):  # the fast path
                        replies += machine.resolve(result)
                    else:
                        self.deciding = asyncio.ensure_future(result)
                        for reply in replies:
                            await context.write(reply)
                        if not await self._settle(self.deciding):
                            return
                        replies = []
                for reply in replies:
                    await context.write(reply)
                if machine.finished:
                    return
        except Exception as exc:
            log.exception("ext_proc stream failure")
            with contextlib.suppress(Exception):
                await context.write(immediate(500, f"inference error: Internal - {exc}"))

    async def _settle(self, task: asyncio.Future[Outcome]) -> bool:
        """Await a decision while reading the stream. False when the stream is over."""
        machine, context = self.machine, self.context
        while True:
            if self.reading is None:
                self.reading = asyncio.ensure_future(context.read())
            await asyncio.wait((task, self.reading), return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                self.deciding = None
                for reply in machine.resolve(task.result()):
                    await context.write(reply)
                return not machine.finished
            req = self.reading.result()
            self.reading = None
            if req is _EOF:
                return False
            for reply in machine.feed(req):
                await context.write(reply)
            if machine.phase is not Phase.DECIDING:  # abandoned or closed: the decision is no longer wanted
                task.cancel()  # still `deciding`: close() waits for it to settle
                return not machine.finished

    def finish(self) -> None:
        """Stop reading, cancel an unsettled decision, and close the exchange exactly once."""
        if self.reading is not None:
            self.reading.cancel()
            self.reading = None
        task, self.deciding = self.deciding, None
        if task is None or task.done():
            if task is not None and not task.cancelled():
                task.exception()  # retrieved: a failure here was already answered or is moot
            self.exchange.close()
            return
        task.cancel()
        task.add_done_callback(_close_after(self.exchange))


def _close_after(exchange: Exchange) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.debug("a cancelled decision failed: %r", task.exception())
        exchange.close()

    return done


def grpc_options(reuse_port: bool = False, limits: ServerLimits | None = None) -> list[tuple[str, int]]:
    """`reuse_port`: the workers of `epp serve --workers N` share one port (SO_REUSEPORT); otherwise a port in use
    is an error, never silently shared. `limits`: the h2 transport's, as far as grpc has options for them."""
    return [("grpc.so_reuseport", 1 if reuse_port else 0), *grpcio_options(limits or ServerLimits())]


TRANSPORTS = ("h2", "grpcio")
DEFAULT_TRANSPORT = "h2"


def build_server(
    director: Director,
    stream_config: StreamConfig | None = None,
    *,
    metrics: ProtocolMetrics | None = None,
    extra_servicers: list[Callable[[Any], object]] | None = None,
    transport: str = DEFAULT_TRANSPORT,
    reuse_port: bool = False,
    limits: ServerLimits | None = None,
) -> tuple[Any, Any]:
    """The gRPC server carrying ExternalProcessor and the Pointsman API (ports are added by the caller).

    `transport`: "h2" (epp.h2grpc: HTTP/2 on asyncio, the ext_proc calls callback-driven) or "grpcio" (grpc.aio).
    Both offer the grpc.aio.Server calls the shell uses (add_*_port, start, stop, generated add_*_to_server).
    `limits`: what one client may make the server spend (epp/h2grpc/limits.py; grpcio gets the options it has)."""
    if transport == "h2":
        from epp.extproc_h2 import PROCESS_PATH, ExtProcH2
        from epp.h2grpc import H2Server

        h2server = H2Server(reuse_port=reuse_port, limits=limits)
        h2svc = ExtProcH2(director, stream_config or StreamConfig(), metrics)
        h2server.add_native_method(PROCESS_PATH, h2svc.call)
        server: Any = h2server
        svc: Any = h2svc
    elif transport == "grpcio":
        server = grpc.aio.server(options=grpc_options(reuse_port, limits))
        svc = ExtProcService(director, stream_config, metrics)
        pb_grpc.add_ExternalProcessorServicer_to_server(svc, server)
    else:
        raise ValueError(f"unknown gRPC transport {transport!r}; expected one of {TRANSPORTS}")
    pointsman_pb2_grpc.add_PointsmanServicer_to_server(PointsmanService(director), server)
    for add in extra_servicers or []:
        add(server)
    return server, svc

"""ext_proc on the h2 transport: one callback-driven call per Envoy stream, the same rules as epp/extproc/server.py.

Per stream it drives one `RequestMachine` and one director exchange, with no task of its own:
- Every complete ProcessingRequest goes to the machine at once; its replies are queued on the stream and leave with
  the other replies of the same read (one write per read, see epp/h2grpc/connection.py).
- When the machine needs a decision the exchange is asked. An `Outcome` is resolved at once (the fast path). An
  awaitable runs as a task; messages that arrive meanwhile are still fed in order, and the machine leaving DECIDING
  (a violation, a local reply) cancels it. When it completes, its replies are sent from its done-callback.
- The stream ends (OK status) when the machine has sent an ImmediateResponse or when Envoy half-closes the
  stream. Every stream ends with exactly one `exchange.close()`, also when Envoy resets it, the connection drops
  or the server stops; with a decision still running, close() runs once that cancelled task has settled.
- A bug inside the machine or the exchange becomes an ImmediateResponse 500, never a dead connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from epp.h2grpc import ServerStream, status
from epp.protocol import Outcome, Phase, RequestMachine, immediate

if TYPE_CHECKING:
    from epp.extproc.server import ProtocolMetrics, StreamConfig
    from epp.request.director import Director

log = logging.getLogger("epp.extproc.server")

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
    __slots__ = ("service", "stream", "machine", "exchange", "deciding", "done")

    def __init__(self, service: ExtProcH2, stream: ServerStream) -> None:
        cfg = service.config
        self.service = service
        self.stream = stream
        self.exchange = service.director.exchange()
        self.machine = RequestMachine(self.exchange, request_body_mode=cfg.request_body_mode,
                                      response_body_mode=cfg.response_body_mode, max_body_bytes=cfg.max_body_bytes)
        self.deciding: asyncio.Future[Outcome] | None = None
        self.done = False

    # ---- StreamHandler -------------------------------------------------------------------------------------
    def on_message(self, data: bytes) -> None:
        try:
            req = _parse(data)
        except DecodeError as e:
            self._close()
            self.stream.finish(status.INTERNAL, f"Exception deserializing request! {e}")
            return
        m = self.machine
        try:
            replies = m.feed(req)
            task = self.deciding
            if task is not None:  # an awaitable decision is running (or was cancelled and is settling)
                if m.phase is not Phase.DECIDING and not task.done():
                    task.cancel()  # abandoned or closed: the decision is no longer wanted
            else:
                d = m.decision  # set by the feed that entered DECIDING
                if d is not None:
                    result = self.exchange.decide(d.headers, d.body, d.metadata)
                    if isinstance(result, Outcome):  # the fast path
                        replies += m.resolve(result)
                    else:
                        self.deciding = task = asyncio.ensure_future(result)
                        task.add_done_callback(self._decided)
            if replies:
                self.stream.send_many([r.SerializeToString() for r in replies])
            if m.finished:
                self._end()
        except Exception as exc:
            self._crash(exc)

    def on_end(self) -> None:
        self._end()

    def on_cancel(self) -> None:
        self._close()

    # ---- internals -----------------------------------------------------------------------------------------
    def _decided(self, task: asyncio.Future[Outcome]) -> None:
        if self.done or task.cancelled():
            return
        try:
            replies = self.machine.resolve(task.result())
            if replies:
                self.stream.send_many([r.SerializeToString() for r in replies])
            if self.machine.finished:
                self._end()
        except Exception as exc:
            self._crash(exc)

    def _crash(self, exc: BaseException) -> None:
        log.error("ext_proc stream failure", exc_info=exc)
        if not self.done:
            self.stream.send(immediate(500, f"inference error: Internal - {exc}").SerializeToString())
        self._end()

    def _end(self) -> None:
        self._close()
        self.stream.finish(status.OK)

    def _close(self) -> None:
        """Cancel an unsettled decision and close the exchange exactly once (after the decision settled)."""
        if self.done:
            return
        self.done = True
        task, self.deciding = self.deciding, None
        exchange = self.exchange
        if task is None or task.done():
            if task is not None and not task.cancelled():
                task.exception()  # retrieved: a failure here was already answered or is moot
            exchange.close()
        else:
            task.cancel()
            task.add_done_callback(lambda t: _close_after(t, exchange))
        violation = self.machine.violation
        if violation is not None:
            log.debug("ext_proc protocol violation: %s", violation)
            metrics = self.service.metrics
            if metrics is not None:
                metrics.protocol_violation(violation)


def _close_after(task: asyncio.Future[Any], exchange: Any) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a cancelled decision failed: %r", task.exception())
    exchange.close()

"""One ext_proc stream's rules, written once for both transports: decide, resolve, cancel, close once.

A transport (epp/extproc/h2.py callback-driven on the h2 server, epp/extproc/aio.py on grpc.aio) owns the I/O and
calls, in stream order:

    session.message(request)   every ProcessingRequest
    session.input_ended()      the client half-closed its side (no more messages)
    session.cancelled()        the stream died (reset, connection lost, deadline, server stop)

and gives the session two callbacks: `send(replies)` (write these ProcessingResponses, in order) and `finish()`
(end the call with OK status). The session guarantees:

- Every message goes to the protocol machine at once, in order; its replies are sent in order.
- When the machine needs a decision, the exchange is asked once. An `Outcome` is resolved at once (the fast path:
  no task). An awaitable runs as a task; messages that arrive meanwhile are still fed in order, and the machine
  leaving DECIDING (a violation, a local reply) cancels it. When it completes, its replies are sent.
- A client that half-closes while its decision is pending still gets the replies (gRPC lets the server answer after
  the client's half-close); the call ends once they are sent. With no decision pending, the half-close ends it.
- The call ends (OK status) when the machine has sent an ImmediateResponse or the input ended; `finish` is called
  at most once, never after `cancelled`.
- `exchange.close()` runs exactly once, whatever ended the stream; with a decision still running, after that
  cancelled task has settled (so anything it committed is released).
- A bug inside the machine or the exchange becomes an ImmediateResponse 500 on this stream, never a dead
  connection. A protocol violation is counted by kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.extproc.settings import StreamConfig as StreamConfig  # defined with the settings (cheap for the CLI)
from epp.protocol import Exchange, Outcome, RawBody, RequestMachine, immediate

if TYPE_CHECKING:
    from epp.request import Director

log = logging.getLogger("epp.extproc")

Replies = list[pb.ProcessingResponse]


class ProtocolMetrics(Protocol):
    """What the ext_proc layer reports (epp.api.metrics.EppMetrics implements it)."""

    def protocol_violation(self, kind: str) -> None: ...


class StreamSession:
    __slots__ = ("machine", "exchange", "metrics", "send", "finish", "deciding", "input_done", "done")

    def __init__(self, director: Director, config: StreamConfig, metrics: ProtocolMetrics | None,
                 send: Callable[[Replies], None], finish: Callable[[], None],
                 stream_metadata: Sequence[tuple[Any, Any]] | None = None) -> None:
        # The stream's gRPC metadata carries Envoy's trace context when Envoy traces (read only with tracing on).
        self.exchange: Exchange = (director.exchange(stream_metadata) if getattr(director, "tracing", None)
                                   is not None else director.exchange())
        self.machine = RequestMachine(self.exchange, request_body_mode=config.request_body_mode,
                                      response_body_mode=config.response_body_mode,
                                      max_body_bytes=config.max_body_bytes)
        self.metrics = metrics
        self.send = send
        self.finish = finish
        self.deciding: asyncio.Future[Outcome] | None = None
        self.input_done = False  # the client half-closed
        self.done = False  # the exchange is closed (and `finish` called, unless cancelled)

    # ---- what the transport calls ----------------------------------------------------------------------------
    def message(self, req: pb.ProcessingRequest) -> None:
        if self.done:
            return
        try:
            self._fed(self.machine.feed(req))
        except Exception as exc:
            self._crash(exc)

    def body(self, chunk: RawBody) -> None:
        """A request body message read from the wire (h2 transport): the same as `message` with it parsed."""
        if self.done:
            return
        try:
            self._fed(self.machine.feed_body(chunk))
        except Exception as exc:
            self._crash(exc)

    def _fed(self, replies: Replies) -> None:
        """After a message went to the machine: start (or drop) the decision, send the replies, end when done."""
        m = self.machine
        task = self.deciding
        if task is not None:  # an awaitable decision is running (or was cancelled and is settling)
            if m.decision is None and not task.done():
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
            self.send(replies)
        if m.finished:
            self._end()

    def input_ended(self) -> None:
        """The client half-closed. A pending decision is still answered; otherwise the call ends now."""
        self.input_done = True
        task = self.deciding
        if task is not None and not task.done():
            return  # `_decided` sends the replies, then ends the call
        self._end()

    def cancelled(self) -> None:
        self._close()

    # ---- internals -------------------------------------------------------------------------------------------
    def _decided(self, task: asyncio.Future[Outcome]) -> None:
        if self.done:
            return
        if task.cancelled():
            if self.input_done:
                self._end()
            return
        try:
            replies = self.machine.resolve(task.result())
            if replies:
                self.send(replies)
            if self.machine.finished or self.input_done:
                self._end()
        except Exception as exc:
            self._crash(exc)

    def _crash(self, exc: BaseException) -> None:
        fields = getattr(self.exchange, "log_fields", None)
        log.error("ext_proc stream failure", exc_info=exc, extra=fields() if fields is not None else None)
        if not self.done:
            try:
                self.send([immediate(500, f"inference error: Internal - {exc}")])
            except Exception:
                log.exception("ext_proc stream: the 500 could not be sent")
        self._end()

    def _end(self) -> None:
        if self.done:
            return
        self._close()
        self.finish()

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
            if self.metrics is not None:
                self.metrics.protocol_violation(violation)


def _close_after(task: asyncio.Future[Any], exchange: Exchange) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a cancelled decision failed: %r", task.exception())
    exchange.close()

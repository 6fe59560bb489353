"""The owner of one request's lifecycle: from the decision Envoy waits for to the stream's close.

`RequestExchange` implements `epp.protocol.Exchange` for the protocol machine. Its decision runs one ordered list of
stages (`STAGES`), each a function of the exchange that answers None (go on), an `Outcome` (the reply: a rejection,
or the routing mutations) or an awaitable of either (the stages after it then run when it completes), so a request
that never waits is decided synchronously:

    resolve   parse the body, route, choose the pool and its candidates          (epp/request/resolve.py)
    admit     the admitters in order: sheddable saturation, rate limits, budgets (epp/request/admit.py)
    prepare   tokenize, for scheduling configs that read token ids               (epp/tokenize)
    queue     flow control: go now, refused, or held until capacity frees        (epp/flowcontrol)
              (these three may wait: epp/request/waiting.py, bound as methods)
    schedule  the scheduler picks (commit.py); a sheddable request no endpoint can serve within its SLO is shed; an
              endpoint waiting for its passive-health probe gets this request
    commit    count it in flight, run pre_request, bind the session, tell the observers, build the mutations

A queued request's turn comes inside flow control's dispatch cycle: it re-resolves its candidates on the pool as it
is then and runs `schedule` and `commit` synchronously there, so it is counted in flight before the next
saturation check.

What happens to the request is reported to the director's observers (epp/request/observe.py): `decided` after the
commit (each may return a follow for the response path), `rejected` for every request that never reaches an
engine (each exactly once). Every decision and rejection gets a decision id first (`decision`, from the director's
`DecisionIds`: a counter, formatted only when read), which the reply can carry in a header and in the
`pointsman` dynamic-metadata namespace (epp/observe/receipts.py). With tracing on the director makes a
`TracedExchange` (epp/observe/tracing.py) instead, which stamps when each stage begins; this class pays nothing
for it. What an admitter holds is given back (`undo`) on a rejection or a failure, and settled
(`closed`) with the response's usage when the stream ends. `close()` releases everything exactly once, whatever
ended the stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from epp.fleet import InflightTicket
from epp.protocol import Outcome
from epp.request import respond, waiting
from epp.request.admit import Hold
from epp.request.commit import mutations, mutations_for_provider, schedule, slo_refusal
from epp.request.director import Director, ShellContext
from epp.request.early import ready
from epp.request.observe import Follow
from epp.request.parsing import api_kind
from epp.request.resolve import Metadata, resolve
from epp.request.streaming import StreamingBody
from epp.request.usage import UsageScanner
from scheduling.api import Scheduler, SchedulingResult
from scheduling.plugins.scorers.agent_session import session_note
from scheduling.types import LLMRequest, SchedulingError

log = logging.getLogger("epp.director")

Step = Outcome | None


def _content_length(headers: Mapping[str, str]) -> int:
    try:
        return max(0, int(headers.get("content-length", "0")))
    except ValueError:
        return 0


class RequestExchange:
    """One stream's request (implements epp.protocol.Exchange). Observers read its public attributes."""

    __slots__ = ("d", "headers", "metadata", "size", "started", "request", "ctx", "result", "scheduler",
                 "schedule_s", "scanner", "served", "decision", "_body", "_pending", "_parsed", "_closed",
                 "_rewrite_from", "_rewrite_to", "_ticket", "_holds", "_follows", "reader", "early", "_ended")

    trace: Any = None  # a TracedExchange's sampled trace (epp/observe/tracing.py); None here, read by observers

    def __init__(self, director: Director) -> None:
        self.d = director
        self.headers: Mapping[str, str] = {}
        self.metadata: Metadata = {}  # the request's metadata (a queued request re-resolves with it)
        self.size = 0  # the request body's size (flow control's queue limits count bytes)
        self.started = 0.0  # the director's clock when the decision began
        self.request: LLMRequest | None = None  # once resolved
        self.ctx: ShellContext | None = None  # once committed: the context the pick was made in
        self.result: SchedulingResult | None = None  # the scheduler's result (None for an external provider)
        self.scheduler: Scheduler | None = None  # the one that picked (a reload may swap the director's)
        self.schedule_s = 0.0  # time spent in the scheduler
        self.scanner: UsageScanner | None = None
        self.served: str | None = None
        self.decision = 0  # the decision id's number once decided or rejected (`decision_id` formats it)
        self._body: bytes | None = None  # until the resolve stage has read it
        self._pending: ShellContext | None = None  # the context being decided
        self._parsed: dict[str, Any] | None = None
        self._closed = False
        self._rewrite_from: bytes | None = None
        self._rewrite_to: bytes | None = None
        self._ticket: InflightTicket | None = None
        self._holds: list[Hold] = []  # what the admitters hold until the stream ends
        self._follows: list[Follow] = []  # the holds, then the observers' follows of the response path
        self.reader: StreamingBody | None = None  # the body, read as it streamed in (full duplex)
        self.early: str | None = None  # decided before the body ended, with this model (epp/request/early.py)
        self._ended = False  # the reader has the whole body

    # ---- the body as it streams in (epp.protocol.contract.BodyReader) -----------------------------------------
    def request_chunk(self, headers: Mapping[str, str], data: bytes, end_of_stream: bool) -> bool:
        """Read one chunk; True when the decision can be made now, before the body ends."""
        reader = self.reader
        if reader is None:
            reader = self.reader = StreamingBody(api_kind(headers))
        reader.feed(data)
        if end_of_stream:
            self._ended = True
            return False
        try:
            self.early = ready(self.d, headers, reader)
        except Exception:  # never crash a stream: decide at the end instead
            log.exception("early decision check failed")
            self.early = None
        return self.early is not None

    # ---- the decision --------------------------------------------------------------------------------------------
    def decide(self, headers: Mapping[str, str], body: bytes | None, metadata: Metadata
               ) -> Outcome | Awaitable[Outcome]:
        """Run the stages. Synchronous (the transports' fast path) unless a stage must wait (a shared rate limit
        asks Redis, the tokens need the engine, flow control queues): then an awaitable, which a client going away
        cancels."""
        self.started = self.d.clock()
        self.headers, self.metadata = headers, metadata
        if body is None and self.reader is not None:  # read as it streamed in
            if not self._ended and self.early is None:
                self._ended = True  # (a reader that was never told the end: the machine decides at the end)
            self.size = self.reader.size if self.early is None else max(_content_length(headers), self.reader.size)
        else:
            self.reader, self.early = None, None
            self.size = len(body) if body else _content_length(headers)
        self._body = body
        return self._run(0)

    def _run(self, i: int) -> Outcome | Awaitable[Outcome]:
        stages = STAGES
        while True:
            step = stages[i](self)
            i += 1
            if step is None:
                continue
            if isinstance(step, Outcome):
                return step
            if isinstance(step, asyncio.Future):  # flow control's queue: it resolves to the reply itself
                return step
            return self._resume(step, i)

    async def _resume(self, pending: Awaitable[Step], i: int) -> Outcome:
        try:
            step = await pending
        except asyncio.CancelledError:
            self._undo_holds()  # the client went away while waiting: hold nothing
            raise
        if step is not None:
            return step
        rest = self._run(i)
        return await rest if inspect.isawaitable(rest) else rest

    # ---- stages -----------------------------------------------------------------------------------------------
    def _resolve(self) -> Step:
        body, self._body = self._body, None
        try:
            if self.reader is not None:
                ctx, self._parsed = resolve(self.d, self.headers, self.reader, self.metadata, early=self.early,
                                            expected_chars=self.size)
            else:
                ctx, self._parsed = resolve(self.d, self.headers, body, self.metadata)
        except SchedulingError as err:
            return self._refuse(err)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        self._pending, self.request = ctx, ctx.request
        return None

    def _schedule(self) -> Step:
        ctx = self._pending
        assert ctx is not None
        if ctx.route is not None and ctx.route.provider is not None:
            return None  # an external provider: no endpoint to pick
        t0 = time.perf_counter()
        try:
            result = schedule(self.d.scheduler_for(ctx), ctx)
        except SchedulingError as err:
            return self._refuse(err)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        self.schedule_s = time.perf_counter() - t0
        shed = slo_refusal(ctx.request, result)
        if shed is not None:
            return self._refuse(shed)
        probe = self.d.probe
        if probe is not None and result.prefill is None:
            target = probe(ctx.candidates)
            if target is not None and target.key != result.primary.key:
                # passive health waits for a probe of this endpoint: this request is it, whatever the scores said
                result = dataclasses.replace(result, targets=[target, *(e for e in result.targets
                                                                        if e.key != target.key)])
        self.result = result
        return None

    def _commit(self) -> Step:
        d, ctx, parsed = self.d, self._pending, self._parsed
        assert ctx is not None
        req = ctx.request
        self.ctx = ctx  # from here on, close() must release what this adds
        self.decision = d.ids.take()
        if req.model and req.target_model != req.model:
            self._rewrite_from = f'"model":"{req.target_model}"'.encode()
            self._rewrite_to = f'"model":"{req.model}"'.encode()
        result = self.result
        if result is None:  # an external provider: no endpoint, counted like any other request
            self._decided()
            rd = ctx.route
            if d.config.log_decisions and rd is not None:
                log.info("decision %s model=%s -> provider %s route=%s/%s%s", req.request_id[:8],
                         req.target_model or "-", rd.backend_name, rd.route.key, rd.rule.name, self._log_ids(),
                         extra=self.log_fields())
            return self._receipt(mutations_for_provider(d, ctx, parsed))
        if self.early is not None:
            parsed = None  # only part of the body: a rewrite changes the model value in the chunks received
        self.scheduler = scheduler = d.scheduler_for(ctx)
        self._ticket = d.datastore.inflight.add(result.primary.key, req.estimated_tokens)
        try:
            scheduler.pre_request(ctx, result)
        except Exception:
            log.exception("pre_request hook failed", extra=self.log_fields())
        if ctx.route is not None:
            ctx.route.commit(result, ctx.now)  # e.g. bind the sticky session
        self._decided()
        if d.config.log_decisions:
            route = f" route={ctx.route.route.key}/{ctx.route.rule.name}->{ctx.route.backend_name}" if ctx.route else ""
            note = session_note(result.state) if req.session is not None else None
            session = f" session={note.session} turn={note.turn}: {note.why}" if note is not None else ""
            log.info("decision %s model=%s -> %s%s (profile %s)%s%s%s%s", req.request_id[:8],
                     req.target_model or "-", result.primary.key,
                     f" prefill={result.prefill.key}" if result.prefill else "", result.profile, route,
                     " (early)" if self.early is not None else "", session, self._log_ids(), extra=self.log_fields())
        out = mutations(d, ctx, result, parsed)
        if self.early is not None and self.reader is not None and req.model and req.target_model != req.model:
            out.body = self.reader.rewritten_prefix(req.target_model, self.reader.size)
        return self._receipt(out)

    # ---- decision ids and log fields (epp/observe/receipts.py, logs.py) -------------------------------------------
    def _receipt(self, outcome: Outcome) -> Outcome:
        """The decision id on the reply, as configured (DecisionIds.stamp)."""
        return self.d.ids.stamp(outcome, self.decision)

    @property
    def pending(self) -> ShellContext | None:
        """The context being decided: resolved candidates and pool, before the commit (None before resolve)."""
        return self._pending

    @property
    def decision_id(self) -> str:
        """The decision id ("" before the request was decided or rejected)."""
        return self.d.ids.format(self.decision) if self.decision else ""

    def trace_id(self) -> str:
        """The W3C trace id the request belongs to (its sampled trace's, else the client's `traceparent`), or ""."""
        trace = self.trace
        if trace is not None:
            return str(trace.trace_id_hex)
        from epp.request.tracecontext import trace_id_of

        return trace_id_of(self.headers.get("traceparent"))

    def log_fields(self) -> dict[str, str]:
        """What a log line about this request carries (`--log-format json` prints them; epp/observe/logs.py)."""
        req = self.request
        return {"decision_id": self.decision_id, "trace_id": self.trace_id(),
                "request_id": req.request_id if req is not None else self.headers.get("x-request-id", "")}

    def _log_ids(self) -> str:
        return f" decision={self.decision_id}" + (f" trace={t}" if (t := self.trace_id()) else "")

    # ---- the stages that may wait (epp/request/waiting.py; plain functions bound as methods) ----------------------
    _admit = waiting.admit
    _admit_later = waiting.admit_later
    _take = waiting.take
    _prepare = waiting.prepare
    _tokenized = waiting.tokenized
    _queue = waiting.queue
    _left_queue = waiting.left_queue
    _dispatch = waiting.dispatch

    # ---- reporting and the response (epp/request/respond.py; plain functions bound as methods) ---------------------
    _decided = respond.decided
    _rejected = respond.rejected
    _refuse = respond.refuse
    _fail = respond.fail
    _undo_holds = respond.undo_holds
    response_headers = respond.response_headers
    response_body = respond.response_body
    response_end = respond.response_end
    close = respond.close


STAGES: tuple[Callable[..., Step | Awaitable[Step]], ...] = (
    RequestExchange._resolve,
    RequestExchange._admit,
    RequestExchange._prepare,
    RequestExchange._queue,
    RequestExchange._schedule,
    RequestExchange._commit,
)
SCHEDULE_STAGE = STAGES.index(RequestExchange._schedule)

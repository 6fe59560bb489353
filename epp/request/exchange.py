"""The director's side of one ext_proc stream: a request from its decision to its close.

`RequestExchange` implements `epp.protocol.Exchange` for the protocol machine. Per stream it:
- decides once: build the context (epp/request/director.py), pass the admission gates (epp/request/gates.py), tokenize when the
  config reads tokens, then schedule at once or through flow control's queue (epp/flowcontrol);
- commits the pick: one in-flight ticket, the scheduler's pre_request hooks, the route's commit (sticky sessions),
  the response watchers (passive health, LLMKube quarantine);
- follows the response: served endpoint, usage, model name restored after a rewrite;
- releases everything exactly once in `close()`, whatever ended the stream (a cancelled queued request gives back
  what its gates held).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from epp.fleet.datastore import InflightTicket
from epp.flowcontrol.controller import DROPPED_REASON, FAIRNESS_HEADER
from epp.protocol import Outcome
from epp.request.director import (
    CONFORMANCE_RESP,
    LB_NS,
    SERVED,
    Director,
    ShellContext,
    error_outcome,
)
from epp.request.gates import Answer, Hold
from epp.request.usage import UsageScanner
from epp.request.watch import ResponseWatch
from scheduling.api import Scheduler, SchedulingResult
from scheduling.types import ErrorCode, SchedulingError

if TYPE_CHECKING:
    from epp.api.dashboard.recorder import DecisionRecord

log = logging.getLogger("epp.request.director")


def _content_length(headers: Mapping[str, str]) -> int:
    try:
        return max(0, int(headers.get("content-length", "0")))
    except ValueError:
        return 0


class RequestExchange:
    """The director's side of one stream (implements epp.protocol.Exchange)."""

    __slots__ = ("d", "scheduler", "ctx", "result", "started", "scanner", "served", "_closed", "_rewrite_from", "_rewrite_to",
                 "_ticket", "rec", "_holds", "_watches", "_meta", "_size")

    def __init__(self, director: Director) -> None:
        self.d = director
        self.scheduler: Scheduler | None = None  # the one that picked (a config reload may swap the director's)
        self.ctx: ShellContext | None = None
        self.result: SchedulingResult | None = None
        self.started = 0.0
        self.scanner: UsageScanner | None = None
        self.served: str | None = None
        self._closed = False
        self._rewrite_from: bytes | None = None
        self._rewrite_to: bytes | None = None
        self._ticket: InflightTicket | None = None
        self.rec: DecisionRecord | None = None  # the dashboard's record of this decision
        self._holds: list[Hold] = []  # what the admission gates hold until the stream ends
        self._watches: list[ResponseWatch] = []  # the response path, reported to the director's watchers
        self._meta: Mapping[str, Mapping[str, object]] = {}  # the request's metadata (a queued request re-resolves)
        self._size = 0  # the request body's size (flow control's queue limits count bytes)

    def decide(
        self, headers: Mapping[str, str], body: bytes | None, metadata: Mapping[str, Mapping[str, object]]
    ) -> Outcome | Awaitable[Outcome]:
        """Build, pass the admission gates, tokenize (only for configs that read token ids), schedule, commit.
        Synchronous (the grpc layer's fast path) unless a gate must wait (a shared rate limit asks Redis) or the
        tokens need an awaitable (a local tokenizer to load, the engine's /tokenize): then an awaitable, which a
        client going away cancels."""
        d = self.d
        self.started = d.clock()
        self._meta, self._size = metadata, len(body) if body else _content_length(headers)
        try:
            ctx, parsed = d.build(headers, body, metadata)
        except SchedulingError as err:
            return self._refuse(None, err, headers)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        return self._through_gates(ctx, parsed, headers, 0)

    # ---- admission gates (epp/request/gates.py) -----------------------------------------------------------------------
    def _through_gates(
        self, ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str], start: int
    ) -> Outcome | Awaitable[Outcome]:
        gates = self.d.gates
        for i in range(start, len(gates)):
            try:
                answer = gates[i].check(ctx, parsed)
            except Exception as exc:
                return self._fail(exc)
            if inspect.isawaitable(answer):
                return self._gate_later(answer, ctx, parsed, headers, i)
            refused = self._take(answer, ctx, headers)
            if refused is not None:
                return refused
        return self._tokenized(ctx, parsed, headers)

    # ---- tokens for configs that read them (precise prefix routing: epp/tokenize/shell.py) ---------------------
    def _tokenized(
        self, ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str]
    ) -> Outcome | Awaitable[Outcome]:
        tokens = self.d.tokens
        if tokens is not None:
            try:
                pending = tokens.prepare(ctx, self.d.scheduler_for(ctx))
            except Exception as exc:
                return self._fail(exc)
            if pending is not None:
                return self._schedule_after(pending, ctx, parsed, headers)
        return self._schedule(ctx, parsed, headers)

    async def _schedule_after(
        self, pending: Awaitable[object], ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str]
    ) -> Outcome:
        try:
            await pending  # never raises: tokenization falls back to the approximation
        except asyncio.CancelledError:
            self._undo_holds()  # the client went away while waiting: hold nothing
            raise
        outcome = self._schedule(ctx, parsed, headers)
        return await outcome if inspect.isawaitable(outcome) else outcome

    async def _gate_later(
        self, pending: Awaitable[Answer], ctx: ShellContext, parsed: dict[str, Any] | None,
        headers: Mapping[str, str], i: int,
    ) -> Outcome:
        try:
            answer = await pending
        except asyncio.CancelledError:
            self._undo_holds()  # the client went away while waiting: hold nothing
            raise
        except Exception as exc:
            return self._fail(exc)
        refused = self._take(answer, ctx, headers)
        if refused is not None:
            return refused
        rest = self._through_gates(ctx, parsed, headers, i + 1)
        return await rest if inspect.isawaitable(rest) else rest

    def _take(self, answer: Answer, ctx: ShellContext, headers: Mapping[str, str]) -> Outcome | None:
        """Keep a gate's hold; a refusal undoes what earlier gates took and is counted like any rejection."""
        if answer is None:
            return None
        if isinstance(answer, Outcome):
            self._undo_holds()
            self._count_rejection(ctx, ErrorCode.RESOURCE_EXHAUSTED.value, headers)
            return answer
        self._holds.append(answer)
        return None

    def _undo_holds(self) -> None:
        holds, self._holds = self._holds, []
        for hold in holds:
            try:
                hold.undo()
            except Exception:
                log.exception("undoing an admission hold failed")

    # ---- flow control (epp/flowcontrol): wait while the pool is saturated -----------------------------------
    def _schedule(
        self, ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str]
    ) -> Outcome | Awaitable[Outcome]:
        flow = self.d.flow
        if flow is None or (ctx.route is not None and ctx.route.provider is not None):
            return self._schedule_now(ctx, parsed, headers)
        try:
            waiting = flow.admit(ctx.pool, headers.get(FAIRNESS_HEADER, ""), ctx.request, self._size,
                                 lambda: self._dispatch(ctx, parsed, headers))
        except Exception as exc:
            return self._fail(exc)
        if waiting is None:
            return self._schedule_now(ctx, parsed, headers)
        if isinstance(waiting, Outcome):  # refused at once (429); the controller counted it
            self._undo_holds()
            self._record_rejection(ctx, ErrorCode.RESOURCE_EXHAUSTED.value, headers)
            return waiting
        return self._queued(waiting, ctx, headers)

    def _dispatch(self, ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str]) -> Outcome:
        """A queued request's turn: schedule it on the pool as it is now, and commit (inside the dispatch cycle)."""
        d = self.d
        try:
            cands = d.candidates(headers, self._meta, route=ctx.route, pool=ctx.pool)
        except SchedulingError as err:
            return self._refuse(ctx, err, headers)
        fresh = ShellContext(ctx.request, cands, d.datastore.inflight.view(), d.clock(), route=ctx.route,
                             pool=ctx.pool)
        return self._schedule_now(fresh, parsed, headers)

    def _queued(self, waiting: asyncio.Future[Outcome], ctx: ShellContext, headers: Mapping[str, str]
                ) -> asyncio.Future[Outcome]:
        """The controller's future, which the protocol driver awaits; what the gates hold goes back when the
        request leaves the queue without being routed. (Done callbacks run in the order they were added, so this one
        runs before the driver's task resumes.)"""

        def settled(fut: asyncio.Future[Outcome]) -> None:
            if fut.cancelled():  # the client went away while queued (the controller took it out of the queue)
                self._undo_holds()
                return
            outcome = fut.result()
            if self.ctx is None and any(name == DROPPED_REASON for name, _ in outcome.reject_headers or ()):
                # Evicted from the queue (its TTL ran out; the controller counted it): nothing reached an engine.
                self._undo_holds()
                self._record_rejection(ctx, ErrorCode.SERVICE_UNAVAILABLE.value, headers)

        waiting.add_done_callback(settled)
        return waiting

    # ---- scheduling and commit ----------------------------------------------------------------------------------
    def _schedule_now(self, ctx: ShellContext, parsed: dict[str, Any] | None, headers: Mapping[str, str]) -> Outcome:
        d = self.d
        try:
            if ctx.route is not None and ctx.route.provider is not None:
                return self._to_provider(ctx, parsed)
            result = d.schedule(ctx)
        except SchedulingError as err:
            return self._refuse(ctx, err, headers)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        req = ctx.request
        # Commit: from here on, close() must release what this adds.
        self.ctx, self.result, self.scheduler = ctx, result, d.scheduler_for(ctx)
        self._ticket = d.datastore.inflight.add(result.primary.key, req.estimated_tokens)
        try:
            self.scheduler.pre_request(ctx, result)
        except Exception:
            log.exception("pre_request hook failed")
        if ctx.route is not None:
            ctx.route.commit(result, ctx.now)  # e.g. bind the sticky session
        if d.watchers:
            self._watch(ctx, result)
        d.metrics.request_started(req.model, req.target_model, req.priority)
        if result.decision:
            d.metrics.disagg_decision(req.target_model, result.decision)
        if d.recorder is not None:
            self.rec = d.recorder.decided(req, len(ctx.candidates), result, self.started, d.clock())
        if d.config.log_decisions:
            route = f" route={ctx.route.route.key}/{ctx.route.rule.name}->{ctx.route.backend_name}" if ctx.route else ""
            log.info("decision %s model=%s -> %s%s (profile %s)%s", req.request_id[:8], req.target_model or "-",
                     result.primary.key, f" prefill={result.prefill.key}" if result.prefill else "", result.profile,
                     route)
        if req.model and req.target_model != req.model:
            self._rewrite_from = f'"model":"{req.target_model}"'.encode()
            self._rewrite_to = f'"model":"{req.model}"'.encode()
        return d.mutations(ctx, result, parsed)

    def _count_rejection(self, ctx: ShellContext | None, code: str, headers: Mapping[str, str]) -> None:
        self.d.metrics.request_error(ctx.request.model if ctx else "", ctx.request.target_model if ctx else "", code)
        self._record_rejection(ctx, code, headers)

    def _record_rejection(self, ctx: ShellContext | None, code: str, headers: Mapping[str, str]) -> None:
        d = self.d
        if d.recorder is not None:
            d.recorder.rejected(ctx.request.model if ctx else "", ctx.request.target_model if ctx else "", code,
                                headers.get("x-request-id", ""), self.started, d.clock())

    def _refuse(self, ctx: ShellContext | None, err: SchedulingError, headers: Mapping[str, str]) -> Outcome:
        """The request never reaches an engine: give back what the gates took, count it, answer the error."""
        self._undo_holds()
        self._count_rejection(ctx, err.code.value, headers)
        return error_outcome(err)

    def _fail(self, exc: BaseException) -> Outcome:
        self._undo_holds()
        log.exception("scheduling failed", exc_info=exc)
        d = self.d
        d.metrics.request_error("", "", ErrorCode.INTERNAL.value)
        if d.recorder is not None:
            d.recorder.rejected("", "", ErrorCode.INTERNAL.value, "", self.started, d.clock())
        return error_outcome(SchedulingError(ErrorCode.INTERNAL, f"scheduling failed: {exc}"))

    def _to_provider(self, ctx: ShellContext, parsed: dict[str, Any] | None) -> Outcome:
        """An external provider target: no endpoint is scheduled; the stream is counted like any other."""
        d, req = self.d, ctx.request
        self.ctx = ctx
        if d.watchers:
            self._watch(ctx, None)
        d.metrics.request_started(req.model, req.target_model, req.priority)
        route = ctx.route
        if d.config.log_decisions and route is not None:
            log.info("decision %s model=%s -> provider %s route=%s/%s", req.request_id[:8], req.target_model or "-",
                     route.backend_name, route.route.key, route.rule.name)
        if req.model and req.target_model != req.model:
            self._rewrite_from = f'"model":"{req.target_model}"'.encode()
            self._rewrite_to = f'"model":"{req.model}"'.encode()
        return d.mutations_for_provider(ctx, parsed)

    def _watch(self, ctx: ShellContext, result: SchedulingResult | None) -> None:
        for watcher in self.d.watchers:
            try:
                w = watcher.watch(ctx, result)
            except Exception:
                log.exception("a response watcher failed")
                continue
            if w is not None:
                self._watches.append(w)

    def response_headers(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]]
    ) -> list[tuple[str, str]]:
        self.scanner = UsageScanner(headers.get("content-type", ""))
        if self.rec is not None:
            self.rec.status = headers.get(":status", "")
        served = metadata.get(LB_NS, {}).get(SERVED)
        if isinstance(served, str):
            self.served = served
        for w in self._watches:
            status = headers.get(":status", "")
            w.response_headers(int(status) if status.isdigit() else 0, self.served)
        out: list[tuple[str, str]] = []
        if self.result is not None and self.result.response_headers:
            out.extend(self.result.response_headers.items())  # e.g. a session token set by a stateful plugin
        if self.d.config.conformance:
            served = self.served or (self.result.primary.key if self.result else "")
            if served:
                out.append((CONFORMANCE_RESP, served))
        return out

    def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        if self.scanner is None:
            self.scanner = UsageScanner()
        self.scanner.feed(chunk, end_of_stream)
        for w in self._watches:
            w.response_chunk(end_of_stream)
        if self.rec is not None and chunk and not self.rec.first_byte:
            self.rec.first_byte = self.d.clock()
        if self._rewrite_from is not None and self._rewrite_to is not None:
            chunk = chunk.replace(self._rewrite_from, self._rewrite_to).replace(
                self._rewrite_from.replace(b":", b": ", 1), self._rewrite_to.replace(b":", b": ", 1)
            )
        return chunk

    def response_end(self) -> None:
        """The response ended without an end-of-stream body message (trailers, or no body messages at all)."""
        for w in self._watches:
            w.response_chunk(True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._watches:
            w.closed()
        if self.ctx is None:
            return
        d = self.d
        live = self._ticket is not None and d.datastore.inflight.remove(self._ticket)
        if d.flow is not None:
            d.flow.kick()  # capacity freed: queued requests may go
        self.ctx.now = d.clock()  # plugins see the time the request ended
        try:
            # An endpoint that left while the request ran was already forgotten by every plugin: telling them how
            # the request ended would only bring its state back.
            if live and self.scheduler is not None and self.result is not None:
                self.scheduler.response_complete(self.ctx, self.result)
        except Exception:
            log.exception("response_complete hook failed")
        usage = self.scanner.usage if self.scanner else None
        holds, self._holds = self._holds, []
        for hold in holds:  # e.g. settle a rate-limit charge with the usage the response reported
            try:
                hold.done(usage)
            except Exception:
                log.exception("releasing an admission hold failed")
        req = self.ctx.request
        d.metrics.request_finished(
            req.model,
            req.target_model,
            d.clock() - self.started,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
        )
        if self.rec is not None and d.recorder is not None:
            d.recorder.finished(self.rec, d.clock(), self.scanner is not None and self.scanner.sse, usage)

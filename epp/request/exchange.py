"""The owner of one request's lifecycle: from the decision Envoy waits for to the stream's close.

`RequestExchange` implements `epp.protocol.Exchange` for the protocol machine. Its decision runs one ordered list of
stages (`STAGES`, named in `STAGE_NAMES`), each a method that answers None (go on), an `Outcome` (the reply: a
rejection, or the routing mutations) or an awaitable of either (the stages after it then run when it completes), so
a request that never waits is decided synchronously:

    resolve   parse the body, route, choose the pool and its candidates          (epp/request/resolve.py)
    admit     the admitters in order: sheddable saturation, rate limits, budgets (epp/request/admit.py)
    prepare   tokenize, for scheduling configs that read token ids               (epp/tokenize)
    queue     flow control: go now, refused, or held until capacity frees        (epp/flowcontrol)
    schedule  the scheduler picks (commit.py); a sheddable request no endpoint can serve within its SLO is shed; an
              endpoint waiting for its passive-health probe gets this request; a loose request whose pick is
              busy is held until it is not, or part of its slack is spent (holding.py, epp/flowcontrol/hold.py)
    commit    count it in flight, run pre_request, bind the session, tell the observers, build the mutations

A queued request's turn (`turn`) comes inside flow control's dispatch cycle (a held one's when it is released): it
re-resolves its candidates on the pool as it is then and runs `schedule` and `commit` synchronously there, so it is
counted in flight before the next saturation check.

Its collaborators hold their own state: the `Intake` the body as it streams in (epp/request/early.py), the
`Ledger` what the admitters charged, given back if the request never reaches an engine (epp/request/admit.py), the
`QueueTurn` its place in flow control's queue (epp/request/queueing.py), the `ResponsePath` who follows the
response and the response itself (epp/request/respond.py).
Every decision and rejection gets a decision id (the director's `DecisionIds`), which the reply can carry.
`marks`, when set (tracing: epp/observe/tracing.py), is stamped with when each stage begins (perf_counter ns).

**Dry run** (`dry_run=True`, explain: epp/api/explain.py): the same stages with their effects switched off.
Admitters charge nothing, tokenization counts nothing, flow control is asked what it would do (`preview`), the
scheduler's random source is copied rather than advanced, and nothing is counted in flight, committed, reported
to observers or given a decision id; `queue.why` says why a real request would wait. Without `wait`, nothing that
would make the decision wait is asked (the synchronous explain). `close()` releases everything exactly once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from epp.fleet import InflightTicket
from epp.protocol import Outcome
from epp.request.admit import Ledger
from epp.request.commit import commit, log_decision, mutations, mutations_for_provider, pick, release
from epp.request.context import error_outcome
from epp.request.early import Intake
from epp.request.holding import hold
from epp.request.queueing import QueueTurn
from epp.request.resolve import Metadata, refresh, resolve
from epp.request.respond import ResponsePath, rejected
from epp.request.tracecontext import trace_id_of
from scheduling.types import ErrorCode, SchedulingError

if TYPE_CHECKING:
    from epp.fleet import InflightTicket
    from epp.request.context import ShellContext
    from epp.request.director import Director
    from epp.request.streaming import StreamingBody
    from epp.request.usage import UsageScanner
    from scheduling.api import Scheduler, SchedulingResult
    from scheduling.types import LLMRequest

log = logging.getLogger("epp.director")

Step = Outcome | None
STAGE_NAMES: tuple[str, ...] = ("resolve", "admit", "prepare", "queue", "schedule", "commit")


class RequestExchange:
    """One stream's request (implements epp.protocol.Exchange). Observers read its public attributes."""

    __slots__ = ("d", "headers", "metadata", "size", "started", "request", "pending", "ctx", "result", "scheduler",
                 "schedule_s", "decision", "early", "dry_run", "marks", "intake", "ledger", "queue", "reply",
                 "_body", "_parsed", "_closed", "_ticket", "_wait")

    trace: Any = None  # a TracedExchange's sampled trace (epp/observe/tracing.py); None here, read by observers

    def __init__(self, director: Director, *, dry_run: bool = False, wait: bool = True) -> None:
        self.d = director
        self.headers: Mapping[str, str] = {}
        self.metadata: Metadata = {}  # the request's metadata (a queued request re-resolves with it)
        self.size = 0  # the request body's size (flow control's queue limits count bytes)
        self.started = 0.0  # the director's clock when the decision began
        self.request: LLMRequest | None = None  # once resolved
        self.pending: ShellContext | None = None  # once resolved: the context being decided (candidates, pool)
        self.ctx: ShellContext | None = None  # once committed: the context the pick was made in
        self.result: SchedulingResult | None = None  # the scheduler's result (None for an external provider)
        self.scheduler: Scheduler | None = None  # the one that picked (a reload may swap the director's)
        self.schedule_s = 0.0  # time spent in the scheduler
        self.decision = 0  # the decision id's number once decided or rejected (`decision_id` formats it)
        self.early: str | None = None  # decided before the body ended, with this model (epp/request/early.py)
        self.dry_run = dry_run
        self.marks: list[int] | None = None  # when set, each stage's start is stamped in it (tracing)
        self.intake: Intake | None = None  # the body as it streams in (full duplex)
        self.ledger = Ledger(dry_run, wait)  # what the admitters hold until the stream ends
        self.queue: QueueTurn | None = None  # its turn in flow control's queue, while flow control is on
        self.reply = ResponsePath()  # who follows the response, and the response as it streams back
        self._body: bytes | memoryview | StreamingBody | None = None  # until the resolve stage has read it
        self._parsed: dict[str, Any] | None = None
        self._closed = False
        self._ticket: InflightTicket | None = None
        self._wait = wait

    @property
    def scanner(self) -> UsageScanner | None:
        """The response's usage scanner (None before the response began)."""
        return self.reply.scanner

    # ---- the body as it streams in (epp.protocol.contract.BodyReader) -----------------------------------------
    def request_chunk(self, headers: Mapping[str, str], data: bytes | memoryview, end_of_stream: bool) -> bool:
        """Read one chunk; True when the decision can be made now, before the body ends."""
        intake = self.intake = self.intake or Intake()
        return intake.chunk(self.d, headers, data, end_of_stream)

    def request_rest(self, data: bytes | memoryview, end_of_stream: bool) -> Outcome | None:
        """A chunk after an early decision; a 400 at the end of a body that names another model (`Intake.rest`)."""
        problem = self.intake.rest(data, end_of_stream) if self.intake is not None else None
        return None if problem is None else self._refuse(SchedulingError(ErrorCode.BAD_REQUEST, problem))

    # ---- the decision: one loop over the stage table ---------------------------------------------------------------
    def decide(self, headers: Mapping[str, str], body: bytes | memoryview | None, metadata: Metadata
               ) -> Outcome | Awaitable[Outcome]:
        """Run the stages. Synchronous (the transports' fast path) unless a stage must wait (a shared rate limit
        asks Redis, the tokens need the engine, flow control queues): then an awaitable, which a client going away
        cancels."""
        self.started = self.d.clock()
        self.headers, self.metadata = headers, metadata
        self.intake, self._body, self.size = Intake.for_decision(self.intake, self.d, headers, body)
        self.early = self.intake.early if self.intake is not None else None
        return self._run(0)

    def _run(self, i: int) -> Outcome | Awaitable[Outcome]:
        stages, marks = STAGES, self.marks
        while True:
            if marks is not None:
                marks[i] = time.perf_counter_ns()
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
            self.ledger.undo()  # the client went away while waiting: hold nothing
            raise
        except Exception as exc:
            return self._fail(exc)
        if step is not None:
            return step
        rest = self._run(i)
        return await rest if inspect.isawaitable(rest) else rest

    # ---- stages -----------------------------------------------------------------------------------------------
    def _resolve(self) -> Step:
        body, self._body = self._body, None
        try:
            ctx, self._parsed = resolve(self.d, self.headers, body, self.metadata, early=self.early,
                                        expected_chars=self.size, dry_run=self.dry_run)
        except SchedulingError as err:
            return self._refuse(err)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        self.pending, self.request = ctx, ctx.request
        return None

    def _admit(self) -> Step | Awaitable[Step]:
        try:
            assert self.pending is not None  # resolved: the admit stage comes after resolve
            return self.ledger.admit(self.d.admitters, self.pending, self._parsed, self._admission_refused)
        except Exception as exc:
            return self._fail(exc)

    def _admission_refused(self, refusal: Outcome) -> Outcome:
        return self._rejected(ErrorCode.RESOURCE_EXHAUSTED.value, refusal)

    def _prepare(self) -> Step | Awaitable[Step]:
        tokens, ctx = self.d.tokens, self.pending
        if tokens is None or ctx is None:
            return None
        try:
            pending = tokens.prepare(ctx, self.d.scheduler_for(ctx), dry_run=self.dry_run, wait=self._wait)
        except Exception as exc:
            return self._fail(exc)
        return None if pending is None else _nothing_after(pending)  # falls back to the approximation

    def _queue(self) -> Step | Awaitable[Step]:
        flow, ctx, d = self.d.flow, self.pending, self.d
        assert ctx is not None
        if flow is None or (ctx.route is not None and ctx.route.provider is not None):
            return None
        self.queue = queue = QueueTurn(flow)
        try:
            waiting = (queue.preview(ctx, self.size) if self.dry_run else
                       queue.enter(self.headers, d.sessions, ctx, self.size, self.turn, self._left_queue))
        except Exception as exc:
            return self._fail(exc)
        if waiting is None or isinstance(waiting, Outcome):  # go now, or refused at once (429)
            return None if waiting is None else self._admission_refused(waiting)
        return waiting

    def _left_queue(self, evicted: Outcome | None) -> None:
        if evicted is None:
            self.ledger.undo()  # (routed: nothing is held any more; the client left: give it back)
        else:  # its TTL ran out, or shutdown: it reached no engine
            self._rejected(ErrorCode.SERVICE_UNAVAILABLE.value, evicted)

    def turn(self) -> Outcome:
        """A queued or held request's turn: re-resolve its candidates on the pool as it is now, schedule and commit."""
        assert self.pending is not None
        try:
            self.pending = refresh(self.d, self.pending, self.headers, self.metadata)
        except SchedulingError as err:
            return self._refuse(err)
        out = self._run(SCHEDULE_STAGE)
        assert isinstance(out, Outcome), "schedule and commit never wait"
        return out

    def _schedule(self) -> Step | asyncio.Future[Outcome]:
        ctx = self.pending
        assert ctx is not None
        if ctx.route is not None and ctx.route.provider is not None:
            return None  # an external provider: no endpoint to pick
        t0 = time.perf_counter()
        try:
            self.result, shed = pick(self.d, ctx, dry_run=self.dry_run)
        except SchedulingError as err:
            return self._refuse(err)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            return self._fail(exc)
        self.schedule_s = time.perf_counter() - t0
        return hold(self) if shed is None else self._refuse(shed)

    def _commit(self) -> Step:
        d, ctx, parsed, result = self.d, self.pending, self._parsed, self.result
        assert ctx is not None
        if self.dry_run:
            return mutations_for_provider(d, ctx, parsed) if result is None else mutations(d, ctx, result, parsed)
        req = ctx.request
        self.ctx = ctx  # from here on, close() must release what this adds
        self.decision = d.ids.take()
        if req.model and req.target_model != req.model:
            self.reply.rewrite(req.target_model, req.model)
        if result is not None:
            if self.early is not None:
                parsed = None  # only part of the body: a rewrite changes the model value in the chunks received
            self.scheduler = scheduler = d.scheduler_for(ctx)
            self._ticket = commit(d, ctx, result, scheduler, self.log_fields)
        self.reply.decided(self, self.ledger.handed())
        log_decision(self)
        if result is None:  # an external provider: no endpoint, counted like any other request
            return d.ids.stamp(mutations_for_provider(d, ctx, parsed), self.decision)
        out = mutations(d, ctx, result, parsed)
        if self.intake is not None and self.early is not None and req.model and req.target_model != req.model:
            out.body = self.intake.rewritten(req.target_model)
        return d.ids.stamp(out, self.decision)

    # ---- a request that never reaches an engine ---------------------------------------------------------------
    def _rejected(self, code: str, outcome: Outcome) -> Outcome:
        """Give back what the admitters hold, report the rejection (not in a dry run), stamp its decision id (a
        request refused after its decision, by `request_rest`, keeps the one it has; its holds follow the response)."""
        self.ledger.undo()
        if self.dry_run:
            return outcome
        self.decision = self.decision or self.d.ids.take()
        rejected(self, code)
        return self.d.ids.stamp(outcome, self.decision)

    def _refuse(self, err: SchedulingError) -> Outcome:
        return self._rejected(err.code.value, error_outcome(err))

    def _fail(self, exc: BaseException) -> Outcome:
        self.request = None  # reported without a model: the failure may lie in what resolved it
        log.exception("scheduling failed", exc_info=exc, extra=self.log_fields())
        return self._rejected(ErrorCode.INTERNAL.value, error_outcome(
            SchedulingError(ErrorCode.INTERNAL, f"scheduling failed: {exc}")))

    # ---- decision ids and log fields (epp/observe/receipts.py, logs.py) -------------------------------------------
    @property
    def decision_id(self) -> str:
        """The decision id ("" before the request was decided or rejected)."""
        return self.d.ids.format(self.decision) if self.decision else ""

    def trace_id(self) -> str:
        """The W3C trace id the request belongs to (its sampled trace's, else the client's `traceparent`), or ""."""
        trace = self.trace
        return str(trace.trace_id_hex) if trace is not None else trace_id_of(self.headers.get("traceparent"))

    def log_fields(self) -> dict[str, str]:
        """What a log line about this request carries (`--log-format json` prints them; epp/observe/logs.py)."""
        req = self.request
        return {"decision_id": self.decision_id, "trace_id": self.trace_id(),
                "request_id": req.request_id if req is not None else self.headers.get("x-request-id", "")}

    # ---- the response (epp/request/respond.py) and the stream's end ---------------------------------------------
    def response_headers(self, headers: Mapping[str, str], metadata: Metadata) -> list[tuple[str, str]]:
        return self.reply.headers(self, headers, metadata)

    def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        return self.reply.body(self, chunk, end_of_stream)

    def response_end(self) -> None:
        self.reply.end(self)

    def close(self) -> None:
        """Release everything exactly once, whatever ended the stream, and settle the follows."""
        if self._closed:
            return
        self._closed = True
        if self.ctx is not None:
            release(self.d, self.ctx, self._ticket, self.scheduler, self.result, self.log_fields)
            self.reply.settle(self)


async def _nothing_after(pending: Awaitable[object]) -> Step:
    await pending
    return None


STAGES: tuple[Callable[[RequestExchange], Step | Awaitable[Step]], ...] = tuple(
    getattr(RequestExchange, f"_{name}") for name in STAGE_NAMES)
SCHEDULE_STAGE = STAGE_NAMES.index("schedule")

"""The stages of `epp.request.exchange.RequestExchange` that may make its decision wait, whose methods these
functions are (bound in its class body, listed in its stage table `STAGES`):

- admit: the admitters in order (sheddable saturation, rate limits, budgets; epp/request/admit.py). One may answer
  later (a shared limit asks Redis); a refusal gives back what the earlier ones hold and is reported;
- prepare: tokenize, for scheduling configs that read token ids (epp/tokenize);
- queue: flow control (epp/flowcontrol) lets the request go now, refuses it, or holds it until capacity frees.
  A queued request's turn comes inside the dispatch cycle (`dispatch`): it re-resolves its candidates on the pool
  as it is then and runs the exchange's `schedule` and `commit` stages synchronously there.

Every state change stays the exchange's: these functions go through its methods (`_refuse`, `_fail`,
`_undo_holds`, `_rejected`, `_receipt`, `_run`) as its own stages do.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from epp.flowcontrol import DROPPED_REASON, fairness_id
from epp.protocol import Outcome
from epp.request.director import ShellContext
from epp.request.resolve import find_candidates
from scheduling.types import ErrorCode, SchedulingError

if TYPE_CHECKING:
    from epp.request.admit import Verdict
    from epp.request.exchange import RequestExchange, Step


# ---- admit ---------------------------------------------------------------------------------------------------
def admit(ex: RequestExchange, start: int = 0) -> Step | Awaitable[Step]:
    admitters = ex.d.admitters
    for i in range(start, len(admitters)):
        try:
            verdict = admitters[i].admit(ex._pending, ex._parsed)
        except Exception as exc:
            return ex._fail(exc)
        if inspect.isawaitable(verdict):
            return ex._admit_later(verdict, i)
        refused = ex._take(verdict)
        if refused is not None:
            return refused
    return None


async def admit_later(ex: RequestExchange, pending: Awaitable[Verdict], i: int) -> Step:
    try:
        verdict = await pending
    except asyncio.CancelledError:
        ex._undo_holds()
        raise
    except Exception as exc:
        return ex._fail(exc)
    refused = ex._take(verdict)
    if refused is not None:
        return refused
    rest = ex._admit(i + 1)
    return await rest if inspect.isawaitable(rest) else rest


def take(ex: RequestExchange, verdict: Verdict) -> Outcome | None:
    """Keep an admitter's hold; a refusal gives back what earlier admitters took and is reported."""
    if verdict is None:
        return None
    if isinstance(verdict, Outcome):
        ex._undo_holds()
        ex._rejected(ErrorCode.RESOURCE_EXHAUSTED.value)
        return ex._receipt(verdict)
    ex._holds.append(verdict)
    return None


# ---- prepare -------------------------------------------------------------------------------------------------
def prepare(ex: RequestExchange) -> Step | Awaitable[Step]:
    tokens = ex.d.tokens
    if tokens is None:
        return None
    ctx = ex._pending
    assert ctx is not None
    try:
        pending = tokens.prepare(ctx, ex.d.scheduler_for(ctx))
    except Exception as exc:
        return ex._fail(exc)
    return None if pending is None else ex._tokenized(pending)


async def tokenized(ex: RequestExchange, pending: Awaitable[object]) -> Step:
    try:
        await pending  # falls back to the approximation rather than failing
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return ex._fail(exc)
    return None


# ---- queue ---------------------------------------------------------------------------------------------------
def queue(ex: RequestExchange) -> Step | Awaitable[Step]:
    flow = ex.d.flow
    ctx = ex._pending
    assert ctx is not None
    if flow is None or (ctx.route is not None and ctx.route.provider is not None):
        return None
    fid = fairness_id(ex.headers)
    if ex.d.sessions is not None:  # per session or program when configured (--flow-fairness-key)
        fid = ex.d.sessions.fairness_id(ctx.request, fid)
    try:
        waiting = flow.admit(ctx.pool, fid, ctx.request, ex.size, ex._dispatch)
    except Exception as exc:
        return ex._fail(exc)
    if waiting is None:
        return None
    if isinstance(waiting, Outcome):  # refused at once (429)
        ex._undo_holds()
        ex._rejected(ErrorCode.RESOURCE_EXHAUSTED.value)
        return ex._receipt(waiting)
    waiting.add_done_callback(ex._left_queue)
    return waiting


def left_queue(ex: RequestExchange, waiting: asyncio.Future[Outcome]) -> None:
    """Flow control's future is done: routed by `dispatch` (inside the dispatch cycle), evicted, or cancelled
    because the client went away. (Done callbacks run in the order they were added, so this one runs before
    the transport resumes.)"""
    if waiting.cancelled():  # the controller took it out of the queue
        ex._undo_holds()
        return
    outcome = waiting.result()
    if ex.ctx is None and any(name == DROPPED_REASON for name, _ in outcome.reject_headers or ()):
        # Evicted from the queue (its TTL ran out, or shutdown): nothing reached an engine.
        ex._undo_holds()
        ex._rejected(ErrorCode.SERVICE_UNAVAILABLE.value)
        ex._receipt(outcome)  # the same reply object the transport is about to send


def dispatch(ex: RequestExchange) -> Outcome:
    """A queued request's turn: re-resolve its candidates on the pool as it is now, schedule and commit."""
    # the exchange's stage table (imported here: exchange.py imports this module)
    from epp.request.exchange import SCHEDULE_STAGE

    d, ctx = ex.d, ex._pending
    assert ctx is not None
    try:
        cands = find_candidates(d, ex.headers, ex.metadata, route=ctx.route, pool=ctx.pool)
    except SchedulingError as err:
        return ex._refuse(err)
    ex._pending = ShellContext(ctx.request, cands, d.datastore.inflight.view(), d.clock(), route=ctx.route,
                               pool=ctx.pool)
    out = ex._run(SCHEDULE_STAGE)
    assert isinstance(out, Outcome), "schedule and commit never wait"
    return out

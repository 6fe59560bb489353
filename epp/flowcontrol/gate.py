"""The director's hook into flow control: queue a built request, and route it when its turn comes.

`flow_gate` is called by `RequestExchange.decide` once the request is parsed and resolved, when flow control is on.
It returns None when the request may be routed at once (the synchronous fast path), a refusal, or an awaitable
the protocol driver waits on while it keeps reading the stream. The queued request keeps only its parsed request:
its candidates, in-flight view and clock are taken afresh when it is dispatched, and only then is anything
committed (in-flight counts, stateful plugins), so a request that leaves the queue unrouted leaves no trace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from epp.flowcontrol.controller import FAIRNESS_HEADER, FlowController
from epp.protocol import Outcome
from scheduling.api import SchedulingContext
from scheduling.types import SchedulingError

if TYPE_CHECKING:
    from epp.director import RequestExchange


def flow_gate(
    flow: FlowController,
    exchange: RequestExchange,
    ctx: SchedulingContext,
    parsed: dict[str, Any] | None,
    headers: Mapping[str, str],
    metadata: Mapping[str, Mapping[str, object]],
    body: bytes | None,
) -> Outcome | Awaitable[Outcome] | None:
    d = exchange.d
    size = len(body) if body else _content_length(headers)
    pool = d.pool_of(metadata) or ""
    return flow.admit(pool, headers.get(FAIRNESS_HEADER, ""), ctx.request, size,
                      _dispatcher(exchange, ctx, parsed, headers, metadata))


def _dispatcher(
    exchange: RequestExchange,
    ctx: SchedulingContext,
    parsed: dict[str, Any] | None,
    headers: Mapping[str, str],
    metadata: Mapping[str, Mapping[str, object]],
) -> Callable[[], Outcome]:
    def dispatch() -> Outcome:
        d = exchange.d
        try:
            candidates = d.candidates(headers, metadata)  # the pool as it is now
        except SchedulingError as err:
            return exchange.reject(err, ctx)
        fresh = SchedulingContext(ctx.request, candidates, d.datastore.inflight.view(), d.clock())
        return exchange.route(fresh, parsed)

    return dispatch


def _content_length(headers: Mapping[str, str]) -> int:
    try:
        return max(0, int(headers.get("content-length", "0")))
    except ValueError:
        return 0

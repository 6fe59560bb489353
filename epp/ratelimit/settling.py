"""Settling an admission: the response's usage replaces the estimates it charged, or a request that never reached
an engine gives its charges back; each exactly once. Methods of `epp.ratelimit.limiter.Limiter` (bound there)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.ratelimit.admission import Charged, Ticket
from epp.ratelimit.limits import Price, tokens
from epp.ratelimit.state import Mode, Op

if TYPE_CHECKING:
    from epp.ratelimit.limiter import Limiter


def settle(lim: Limiter, ticket: Ticket | None, *, input_tokens: object = None, output_tokens: object = None,
           price: Price | None = None) -> None:
    """Replace the admission's estimates with what the response's usage reported, exactly once.

    None keeps the estimate (a response without usage, or lean response phases: the output estimate stays
    charged). `price` re-prices USD limits (the backend that served). Shared limits are updated in the
    background (`flush`), so this never waits.
    """
    if ticket is None or ticket.closed:
        return
    ticket.closed = True
    inp = ticket.input_tokens if input_tokens is None else tokens(input_tokens)
    out = ticket.output_estimate if output_tokens is None else tokens(output_tokens)
    p = price if price is not None else ticket.price
    _apply(lim, [(e, e.op.limit.metric.amount(inp, out, p) - e.op.charge) for e in ticket.entries])


def refund(lim: Limiter, ticket: Ticket | None) -> None:
    """Undo an admission whose request never reached an engine (exactly once; settle after it does nothing)."""
    if ticket is None or ticket.closed:
        return
    ticket.closed = True
    _apply(lim, [(e, -e.op.charge) for e in ticket.entries])


def _apply(lim: Limiter, deltas: list[tuple[Charged, float]]) -> None:
    local: list[Op] = []
    fallback: list[Op] = []
    for e, delta in deltas:
        if not delta:
            continue
        op = Op(e.op.key, e.op.limit, 0.0, delta, e.slot if delta < 0 else -1, e.op.label)
        if e.store == "local":
            local.append(op)
        elif e.store == "fallback":
            fallback.append(op)
        elif e.store == "redis" and lim.link is not None:
            lim.link.queue(op)
    for store, ops in ((lim.local, local), (lim.fallback, fallback)):
        if ops:
            before = store.dropped
            store.run(ops, Mode.CHARGE, lim.clock())
            if store.dropped > before:
                lim.metrics.lost(store.dropped - before)

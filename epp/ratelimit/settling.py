"""Settling an admission: the response's usage replaces the estimates it charged, or a request that never reached
an engine gives its charges back; each exactly once. Charges in this process's stores are applied at once, those
in Redis are queued on the link (sent in the background), so settling never waits."""

from __future__ import annotations

from collections.abc import Callable

from epp.ratelimit.admission import Charged, Ticket
from epp.ratelimit.limits import Price, tokens
from epp.ratelimit.link import MetricsSink, RedisLink
from epp.ratelimit.state import LocalStore, Mode, Op


class Settler:
    """Applies the deltas of settled and refunded tickets to the stores they were charged in."""

    __slots__ = ("local", "fallback", "link", "clock", "metrics")

    def __init__(self, local: LocalStore, fallback: LocalStore, link: RedisLink | None, clock: Callable[[], float],
                 metrics: MetricsSink) -> None:
        self.local = local
        self.fallback = fallback
        self.link = link
        self.clock = clock
        self.metrics = metrics

    def settle(self, ticket: Ticket | None, *, input_tokens: object = None, output_tokens: object = None,
               price: Price | None = None) -> None:
        """Replace the admission's estimates with what the response's usage reported, exactly once.

        None keeps the estimate (a response without usage, or lean response phases: the output estimate stays
        charged). `price` re-prices USD limits (the backend that served).
        """
        if ticket is None or ticket.closed:
            return
        ticket.closed = True
        inp = ticket.input_tokens if input_tokens is None else tokens(input_tokens)
        out = ticket.output_estimate if output_tokens is None else tokens(output_tokens)
        p = price if price is not None else ticket.price
        self.apply([(e, e.op.limit.metric.amount(inp, out, p) - e.op.charge) for e in ticket.entries])

    def refund(self, ticket: Ticket | None) -> None:
        """Undo an admission whose request never reached an engine (exactly once; settle after it does nothing)."""
        if ticket is None or ticket.closed:
            return
        ticket.closed = True
        self.apply([(e, -e.op.charge) for e in ticket.entries])

    def apply(self, deltas: list[tuple[Charged, float]]) -> None:
        """Charge each delta to the store its entry was charged in (a negative one to the slot it was charged)."""
        local: list[Op] = []
        fallback: list[Op] = []
        link = self.link
        for e, delta in deltas:
            if not delta:
                continue
            op = Op(e.op.key, e.op.limit, 0.0, delta, e.slot if delta < 0 else -1, e.op.label)
            if e.store == "local":
                local.append(op)
            elif e.store == "fallback":
                fallback.append(op)
            elif e.store == "redis" and link is not None:
                link.queue(op)
        for store, ops in ((self.local, local), (self.fallback, fallback)):
            if ops:
                before = store.dropped
                store.run(ops, Mode.CHARGE, self.clock())
                if store.dropped > before:
                    self.metrics.lost(store.dropped - before)

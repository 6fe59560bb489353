"""The charges a request makes: which state each limit that applies to it is charged in, how much, and how much
must remain for it to be admitted (a `Plan`); and the limits in force, for snapshots and gauges.

    need(limit)   = known + epsilon (at most the amount)   limits that count output: room for one more unit, not
                                                           when the input alone fills the amount (then an empty
                                                           limit admits it)
                  = known                                   the others
    charge(limit) = known + later                           known: input tokens (and their cost); later: the
                                                            output estimate for limits that count output

A limit applied twice to one request (the same limit and scope) charges once. The fallback (shared limits while
Redis is down, policy `local`) charges each shared limit at its amount divided by the expected replica count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from epp.ratelimit.limits import Limit, Price, scope_key, scope_label, tokens
from epp.ratelimit.state import Op

Applied = tuple[Limit, str]  # a limit and the scope value it applies to ('' when unscoped)
MAX_SCOPES = 4096  # scope values whose key and label are kept


def need(limit: Limit, known: float) -> float:
    """What must remain of `limit` for a request whose known part is `known` (see the module docstring)."""
    if limit.metric.counts_output and known <= limit.amount:
        return min(known + limit.metric.epsilon, limit.amount)
    return known


class Plan:
    """One request's ops: `local` (this process's limits) and `shared` (Redis's, or the fallback's)."""

    __slots__ = ("local", "shared", "input_tokens", "output_estimate", "price")

    def __init__(self, input_tokens: int, output_estimate: int, price: Price | None) -> None:
        self.local: list[Op] = []
        self.shared: list[Op] = []
        self.input_tokens = input_tokens
        self.output_estimate = output_estimate
        self.price = price


class Planner:
    """Plans the charges of requests; keeps the limits seen (`registered`), the scope keys (a small cache) and the
    fallback's scaled limits. `shared_in_redis`: shared limits go to `Plan.shared` (else they are local)."""

    __slots__ = ("shared_in_redis", "replicas", "registered", "_scopes", "_scaled")

    def __init__(self, shared_in_redis: bool, replicas: int) -> None:
        self.shared_in_redis = shared_in_redis
        self.replicas = replicas
        self.registered: dict[str, Limit] = {}
        self._scopes: dict[str, tuple[str, str]] = {}  # scope value -> (key, label)
        self._scaled: dict[tuple[str, float, float], Limit] = {}

    def configure(self, limits: Iterable[Limit]) -> None:
        self.registered = {lim.id: lim for lim in limits}

    def plan(self, applied: Sequence[Applied], input_tokens: object, output_estimate: object,
             price: Price | None) -> Plan:
        plan = Plan(tokens(input_tokens), tokens(output_estimate), price)
        seen: set[str] = set()
        scopes = self._scopes
        registered = self.registered
        shared_in_redis = self.shared_in_redis
        for limit, scope in applied:
            scope = scope if isinstance(scope, str) else ""
            hashed = scopes.get(scope)
            if hashed is None:
                if len(scopes) >= MAX_SCOPES:
                    scopes.clear()
                hashed = scopes[scope] = (scope_key(scope), scope_label(scope))
            key = f"{limit.id}|{hashed[0]}"
            if key in seen:
                continue
            seen.add(key)
            if limit.id not in registered:
                registered[limit.id] = limit
            known, later = limit.metric.parts(plan.input_tokens, plan.output_estimate, price)
            op = Op(key, limit, need(limit, known), known + later, -1, hashed[1], known)
            (plan.shared if limit.shared and shared_in_redis else plan.local).append(op)
        return plan

    def fallback_op(self, op: Op) -> Op:
        """`op` for the fallback store: its limit's amount divided by the expected replica count."""
        k = (op.limit.id, op.limit.amount, op.limit.period_s)
        lim = self._scaled.get(k)
        if lim is None:
            if len(self._scaled) > 4 * len(self.registered) + 64:
                self._scaled.clear()  # limits were reconfigured many times: forget the old ones
            lim = self._scaled[k] = op.limit.scaled(1.0 / self.replicas)
        return Op(op.key, lim, need(lim, op.known), op.charge, op.slot, op.label, op.known)

"""The director's side of rate limits: which limits a routed request carries, its admission, the 429 Outcome.

A Kthena ModelRoute's `rateLimit` (parsed by epp/routing into `RouteDecision.rate_limit`) becomes two token
buckets counted per route (`RouteDecision.rate_limit_key`, e.g. `ModelRoute/default/deepseek`): input tokens and
output tokens per unit, shared through Redis when the route sets `global` (and the limiter has a Redis; without
one they are enforced in each replica, as Kthena's local limits are). Budgets (LLMKube) add their own limits
through `extra`.

The gate is an admitter of the request path (epp/request/admit.py): `admit(ctx, parsed)` charges the request's
estimated tokens (`charge`: an Admission, or an awaitable one when a shared limit asks Redis) and answers None (no
limit applies), the 429 Outcome (Retry-After and x-ratelimit-* headers), or a hold on the charge: refunded if the
request never reaches an engine, else settled with the response's usage when the stream closes (usage None, with
lean phases: the estimates stay).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol

from epp.protocol import Outcome
from epp.ratelimit.admission import ADMITTED, Admission, Ticket
from epp.ratelimit.limiter import Limiter
from epp.ratelimit.limits import Limit, Metric, Price, declared_output
from epp.ratelimit.planning import Applied


class RequestView(Protocol):
    """What the gates read of the parsed request (scheduling's LLMRequest)."""

    @property
    def estimated_tokens(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class AdmissionContext(Protocol):
    """What the gates read of a request's context (epp/request's AdmissionContext): the request, and the routing
    layer's decision (`route`, None without routes), read by attribute as each dialect shapes it."""

    @property
    def request(self) -> RequestView: ...
    @property
    def route(self) -> object: ...


class TokenUsage(Protocol):
    """A response's token usage (epp/request's Usage); `found` is False when the response carried none."""

    @property
    def found(self) -> bool: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


class RouteRateLimit(Protocol):
    """A route's token rate limits as the gate reads them (epp.routing's `RateLimit`); hashable, as a cache key."""

    @property
    def input_tokens_per_unit(self) -> int | None: ...
    @property
    def output_tokens_per_unit(self) -> int | None: ...
    @property
    def unit(self) -> str: ...
    @property
    def redis_address(self) -> str | None: ...


class _RateHold:
    """What an admitted request holds: its charge, refunded if it never reaches an engine, else settled."""

    __slots__ = ("gate", "ticket", "price")

    def __init__(self, gate: RateLimitGate, ticket: Ticket, price: Price | None) -> None:
        self.gate, self.ticket, self.price = gate, ticket, price

    def undo(self) -> None:
        self.gate.limiter.refund(self.ticket)

    def response_headers(self, ex: object, status: int, served: str | None) -> None:
        pass

    def response_chunk(self, ex: object, size: int, end_of_stream: bool) -> None:
        pass

    def closed(self, ex: object, usage: TokenUsage | None) -> None:
        self.gate.settle(self.ticket, usage, price=self.price)


Answer = Outcome | _RateHold | None  # nothing to hold, the 429, or the hold on the charge


class RateLimitGate:
    """The admitter for token rate limits (epp/request/admit.py): `admit` answers None (no limit), a 429 Outcome,
    or a hold on the charge; an awaitable when a shared limit asks Redis."""

    name = "rate-limit"

    def __init__(self, limiter: Limiter, *, default_output_tokens: int = 0) -> None:
        self.limiter = limiter
        self.default_output_tokens = default_output_tokens
        self._routes: dict[tuple[str, RouteRateLimit], list[Limit]] = {}

    def route_limits(self, key: str, rate_limit: RouteRateLimit) -> list[Limit]:
        """The limits of one route's `RateLimit` (epp.routing.model), built once per (route, configuration)."""
        cached = self._routes.get((key, rate_limit))
        if cached is not None:
            return cached
        if len(self._routes) > 10_000:
            self._routes.clear()  # routes were reconfigured many times: forget the old ones
        shared = rate_limit.redis_address is not None
        out: list[Limit] = []
        if rate_limit.input_tokens_per_unit is not None:
            out.append(Limit.per_unit(key, Metric.INPUT_TOKENS, rate_limit.input_tokens_per_unit, rate_limit.unit,
                                      shared=shared))
        if rate_limit.output_tokens_per_unit is not None:
            out.append(Limit.per_unit(key, Metric.OUTPUT_TOKENS, rate_limit.output_tokens_per_unit,
                                      rate_limit.unit, shared=shared))
        self._routes[(key, rate_limit)] = out
        return out

    def applied(self, ctx: AdmissionContext, extra: Sequence[Applied] = ()) -> list[Applied]:
        """The limits a request's context carries: its route's rate limits, plus `extra` (e.g. budgets)."""
        route = getattr(ctx, "route", None)
        rate = getattr(route, "rate_limit", None)
        out: list[Applied] = []
        if route is not None and rate is not None:
            out = [(lim, "") for lim in self.route_limits(route.rate_limit_key, rate)]
        out.extend(extra)
        return out

    def charge(self, ctx: AdmissionContext, input_tokens: int, body: object = None, *, extra: Sequence[Applied] = (),
               price: Price | None = None, dry_run: bool = False) -> Admission | Awaitable[Admission]:
        """Admission for one request: an `Admission` at once unless Redis must be asked (then an awaitable).
        The output estimate is the request's declared bound (`max_tokens` ...) or the configured default."""
        applied = self.applied(ctx, extra)
        if not applied:
            return ADMITTED
        output = declared_output(body, self.default_output_tokens)
        adm = self.limiter.admit_nowait(applied, input_tokens, output, price, dry_run=dry_run)
        if adm is not None:
            return adm
        return self.limiter.admit(applied, input_tokens, output, price, dry_run=dry_run)

    def admit(self, ctx: AdmissionContext, parsed: Mapping[str, object] | None, *, dry_run: bool = False
              ) -> Answer | Awaitable[Answer]:
        """The admitter interface (epp/request/admit.py): input tokens are the request's (tokenized, or
        estimated)."""
        if not self.applied(ctx):
            return None
        adm = self.charge(ctx, ctx.request.estimated_tokens, parsed, dry_run=dry_run)
        if inspect.isawaitable(adm):
            return self._answer_later(adm)
        return self._answer(adm)

    async def _answer_later(self, adm: Awaitable[Admission]) -> Answer:
        return self._answer(await adm)

    def _answer(self, adm: Admission) -> Answer:
        if not adm.allowed:
            return self.rejection(adm)
        return _RateHold(self, adm.ticket, None) if adm.ticket is not None else None

    @staticmethod
    def rejection(adm: Admission) -> Outcome:
        """The 429 for a refused admission."""
        return Outcome(reject_status=adm.status_code, reject_body=adm.message, reject_headers=adm.headers)

    def settle(self, ticket: Ticket | None, usage: TokenUsage | None = None, *, price: Price | None = None) -> None:
        """Settle with a response's usage (epp.request.usage.Usage); None or usage not found keeps the estimates."""
        if ticket is None:
            return
        if usage is None or not getattr(usage, "found", False):
            self.limiter.settle(ticket, price=price)
        else:
            self.limiter.settle(ticket, input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                                price=price)

"""One request's routing decision: the route, rule and target the router chose, and what that means for the request.

Made by `Router.decide` (epp/routing/router.py) or a dialect's runtime (LLMKube's ModelRouter), read by the request
path (epp/request): the pool to schedule in and the model the engine sees, or the external provider; P/D pairing
and sticky sessions narrow the candidates; the fallbacks Envoy may retry on; the headers to set and remove.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from epp.routing.model import PoolBackend, ProviderBackend, RateLimit, Route, Rule, Target
from epp.routing.pools import ROLE_LABEL
from epp.routing.sticky import StickyTable
from scheduling.api import InflightLoad, Scheduler, SchedulingResult
from scheduling.types import Endpoint, ErrorCode, SchedulingError

MAX_RETRIES_HEADER = "x-envoy-max-retries"


@dataclass(slots=True)
class RouteDecision:
    route: Route
    rule: Rule
    target: Target
    by_adapter: bool = False
    pool: PoolBackend | None = None
    provider: ProviderBackend | None = None
    engine_model: str | None = None  # the model the engine (or provider) is asked for; None keeps the request's
    base_model: str | None = None  # for a LoRA adapter: its ModelServer's model
    scheduler: Scheduler | None = None  # the pool's own scheduler (P/D pairing); None: the director's
    sticky: StickyTable | None = None
    session: int | None = None  # hash of the session key
    pinned: str | None = None  # the endpoint the session is bound to, when it is a candidate
    unpinned: list[Endpoint] = field(default_factory=list)  # the candidates before the pin (if the pin fails)
    set_headers: list[tuple[str, str]] = field(default_factory=list)
    remove_headers: list[str] = field(default_factory=list)
    sensitive: frozenset[str] = frozenset()  # header names whose values are never shown (credentials)

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def pool_name(self) -> str | None:
        return self.pool.pool if self.pool is not None else None

    @property
    def backend_name(self) -> str:
        return self.target.backend

    @property
    def rate_limit(self) -> RateLimit | None:
        """The route's token rate limits (None: unlimited)."""
        return self.route.rate_limit

    @property
    def rate_limit_key(self) -> str:
        """What the limits are counted per: the route (`ModelRoute/<namespace>/<name>`)."""
        return f"{self.route.kind}/{self.route.key}"

    @property
    def retries(self) -> int:
        return self.pool.retries if self.pool is not None else 0

    # ---- candidates ----------------------------------------------------------------------------------------
    def narrow(self, candidates: list[Endpoint], now: float) -> list[Endpoint]:
        """P/D: only decode endpoints with a prefill endpoint in their group. Sticky: the bound endpoint alone."""
        pool = self.pool
        if pool is None:
            return candidates
        if pool.pd is not None:
            key = pool.pd.group_key
            groups = {e.labels.get(key) for e in candidates if e.labels.get(ROLE_LABEL) in ("prefill", "both")}
            kept = [e for e in candidates
                    if e.labels.get(ROLE_LABEL) in ("prefill", "both") or e.labels.get(key) in groups]
            if not any(e.labels.get(ROLE_LABEL) in ("decode", "both") for e in kept):
                raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE,
                                      f"no decode endpoint of {pool.kind} {pool.key} has a prefill endpoint in its "
                                      f"{key!r} group")
            return kept
        if self.sticky is not None and self.session is not None:
            bound = self.sticky.lookup(self.session, now)
            for e in candidates:
                if e.key == bound:
                    self.pinned, self.unpinned = e.key, candidates
                    return [e]
        return candidates

    def unpin(self) -> list[Endpoint] | None:
        """The candidates without the sticky pin, when a pin was applied (the bound endpoint was filtered out)."""
        if self.pinned is None:
            return None
        self.pinned = None
        return self.unpinned

    def fallbacks(self, result: SchedulingResult, candidates: Sequence[Endpoint],
                  inflight: Mapping[str, InflightLoad]) -> list[str]:
        """Primary first, then `retries` endpoints Envoy may retry on: other endpoints first (the scheduler's own
        ranking, then the least loaded of the remaining candidates; a sticky pin does not narrow them; with P/D
        pairing, only decode endpoints of the primary's group, as the prefill endpoint sent along belongs to that
        group). When there are fewer other endpoints than retries, the list goes round again from the primary:
        `retry.attempts` is "the maximum number of times an individual request should be retried", one endpoint or
        many, and Envoy's override_host policy takes one listed entry per attempt (an exhausted list falls back to
        the cluster's own load balancing), so the same host is listed again to be retried."""
        out = [result.primary.key]
        want = 1 + self.retries
        if want <= 1:
            return out
        seen = {result.primary.key}
        if result.prefill is not None:
            seen.add(result.prefill.key)
        pool: list[Endpoint] = [*result.targets[1:]]

        def load(e: Endpoint) -> tuple[int, str]:
            lo = inflight.get(e.key)
            return ((lo.requests if lo else 0) + e.metrics.waiting + e.metrics.running, e.key)

        pool += sorted(self.unpinned or candidates, key=load)
        pd = self.pool.pd if self.pool is not None else None
        group = result.primary.labels.get(pd.group_key) if pd is not None else None
        for e in pool:
            if len(out) >= want:
                break
            if e.key in seen or e.labels.get(ROLE_LABEL) == "prefill":
                continue
            if pd is not None and e.labels.get(pd.group_key) != group:
                continue
            seen.add(e.key)
            out.append(e.key)
        distinct = len(out)
        while len(out) < want:  # fewer endpoints than retries: the same ones again, in order
            out.append(out[len(out) % distinct])
        return out

    def commit(self, result: SchedulingResult, now: float) -> None:
        """The pick is committed: bind (or refresh) the session."""
        if self.sticky is not None and self.session is not None and result.targets:
            self.sticky.bind(self.session, result.primary.key, now)

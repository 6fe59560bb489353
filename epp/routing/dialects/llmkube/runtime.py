"""LLMKube's ModelRouter at run time: the decision the director applies, and the state behind it.

`LLMKubeRouting` is the Router's ModelRouter part (epp/routing/router.py calls it when no route names the
requested model and ModelRouters are loaded). Per ModelRouter it keeps a `RouterRuntime`: the quarantine tracker
and first-byte latencies (epp/routing/dialects/llmkube/quarantine.py) and one balancing scheduler per local backend
(epp/routing/dialects/llmkube/balance.py). It is also a director watcher: every request it routed gets a `StreamWatch`
that reports the response path (status, silence, first byte) to its router's tracker.

Which ModelRouter: the one Envoy names in dynamic metadata `pointsman.router` ("namespace/name", a per-route
set_metadata like `pointsman.pool`), else the oldest one.

What a decision sets on the request (`ModelRouterDecision`):
- local backend: its pods are scheduled by its balancing scheduler (quarantined pods are not candidates); the
  fallbacks (primary-fallback order, or weighted draws) add one pod each, the least loaded that is not
  quarantined, to `envoy.lb` for Envoy's retries (external fallbacks cannot be retried into: another cluster);
- external backend: the provider's cluster, path, credential and model (as a Kthena ExternalModelProvider);
- `X-Gateway-Base-Model-Name` and `x-ai-eg-model`: the serving backend's displayName (else name), the value the
  gateway's routes match in the AgentGateway and Gateway data planes;
- `x-envoy-upstream-rq-timeout-ms` for a request that does not stream: rule.timeout, else backend.timeout, else
  `proxy.responseHeaderTimeout`, never above the latter (a streamed response is bounded by the stream idle timeout);
- shadow: `x-pointsman-mirrors: n` and `x-pointsman-mirror-<i>: ip:port` for each mirror target (its least-loaded
  pod that is not quarantined); the routes from `epp envoy-config` mirror the request there.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epp.routing.decision import RouteDecision
from epp.routing.dialects.llmkube.balance import balancing_scheduler
from epp.routing.dialects.llmkube.classification import features
from epp.routing.dialects.llmkube.match import Plan, decide
from epp.routing.dialects.llmkube.model import ModelRouterSpec, RouterBackend
from epp.routing.dialects.llmkube.quarantine import FailureTracker, LatencyWindow, StreamWatch
from epp.routing.model import Match, Rule
from scheduling.api import NO_LOAD, InflightLoad, SchedulingResult
from scheduling.plugins.scorers.least_work import work
from scheduling.types import Endpoint, ErrorCode, SchedulingError

if TYPE_CHECKING:
    from epp.routing.dialect import RoutedRequest
    from epp.routing.router import Router
    from scheduling.config import ModelScheduler

log = logging.getLogger(__name__)

MIRRORS_HEADER = "x-pointsman-mirrors"
MAX_MIRRORS = 8
TIMEOUT_HEADER = "x-envoy-upstream-rq-timeout-ms"
ROUTER_METADATA = ("pointsman", "router")
POD_THRESHOLD = 2  # failures in a row that quarantine a pod of a local backend
BACKEND_THRESHOLD = 1  # ... an external backend


def mirror_header(i: int) -> str:
    return f"x-pointsman-mirror-{i}"


RESERVED_HEADERS = (MIRRORS_HEADER, *(mirror_header(i) for i in range(1, MAX_MIRRORS + 1)))


class RouterRuntime:
    """What one ModelRouter keeps between requests."""

    def __init__(self, spec: ModelRouterSpec, rng: random.Random) -> None:
        self.spec = spec
        self.tracker = FailureTracker(spec.quarantine_s)
        self.latency = LatencyWindow()
        self.schedulers: dict[str, ModelScheduler] = {}
        self.update(spec, rng)

    def update(self, spec: ModelRouterSpec, rng: random.Random) -> None:
        old = self.spec
        self.spec = spec
        self.tracker.quarantine_s = spec.quarantine_s
        keep = {}
        for name, b in spec.backends.items():
            if b.kind != "pool":
                continue
            prev = old.backends.get(name)
            sched = self.schedulers.get(name)
            if sched is None or prev is None or prev.balancing != b.balancing:
                sched = balancing_scheduler(b.balancing, rng, f"ModelRouter {spec.key} backend {name}")
            keep[name] = sched
        self.schedulers = keep

    def endpoint_removed(self, key: str) -> None:
        self.tracker.forget(key)
        for s in self.schedulers.values():
            s.endpoint_removed(key)


@dataclass(slots=True)
class ModelRouterDecision(RouteDecision):
    spec: ModelRouterSpec = field(kw_only=True)
    runtime: RouterRuntime = field(kw_only=True)
    plan: Plan = field(kw_only=True)
    backend: RouterBackend = field(kw_only=True)  # the backend that serves
    owner: LLMKubeRouting = field(kw_only=True)
    resolved_pool: str | None = None
    timeout_s: float | None = None
    mirror_endpoints: list[tuple[str, str]] = field(default_factory=list)  # (backend, ip:port)
    fallback_keys: tuple[str, ...] = ()  # set once scheduled: the endpoints after the primary in envoy.lb
    classifications: frozenset[str] = frozenset()  # what the request carries (normalized)

    @property
    def pool_name(self) -> str | None:
        return self.resolved_pool if self.pool is not None else None

    @property
    def strategy(self) -> str:
        return str(self.plan.strategy) if self.plan is not None else ""

    @property
    def retries(self) -> int:
        return len(self.plan.fallbacks) if self.plan is not None else 0

    def narrow(self, candidates: list[Endpoint], now: float) -> list[Endpoint]:
        """Quarantined pods are not candidates (a half-open one is, for its one probe)."""
        tracker = self.runtime.tracker
        kept = [e for e in candidates if tracker.available(e.key, now)]
        if not kept:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, f"every endpoint of backend {self.backend.name!r} "
                                                                 "is quarantined")
        return kept

    def unpin(self) -> list[Endpoint] | None:
        return None

    def fallbacks(self, result: SchedulingResult, candidates: Sequence[Endpoint],
                  inflight: Mapping[str, InflightLoad]) -> list[str]:
        """The primary, then one pod of each local fallback backend, in the plan's order."""
        out = [result.primary.key]
        for b in self.plan.fallbacks:
            if b.kind != "pool":
                continue
            key = self.owner.best_endpoint(self.runtime, b, inflight)
            if key is not None and key not in out:
                out.append(key)
        self.fallback_keys = tuple(out[1:])
        return out

    def commit(self, result: SchedulingResult, now: float) -> None:
        """Nothing to bind: the balancing scheduler records its own state (pre_request)."""


class LLMKubeRouting:
    """The dialect's runtime (epp/routing/dialect.py: DialectRuntime) for the Router."""

    name = "llmkube"
    reserved_headers = RESERVED_HEADERS

    def __init__(self, router: Router, *, gateway_headers: Sequence[str] = ("x-gateway-base-model-name",
                                                                             "x-ai-eg-model"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router
        self.gateway_headers = tuple(h.lower() for h in gateway_headers if h)
        self.clock = clock
        self.runtimes: dict[str, RouterRuntime] = {}
        self._order: tuple[str, ...] = ()  # the loaded routers' keys, oldest first

    def active(self) -> bool:
        return bool(self._order)

    # ---- configuration -------------------------------------------------------------------------------------
    def apply(self, routers: Sequence[ModelRouterSpec]) -> None:
        rng = self.router.rng
        runtimes = {}
        for spec in routers:
            rt = self.runtimes.get(spec.key)
            if rt is None:
                rt = RouterRuntime(spec, rng)
            elif rt.spec != spec:
                rt.update(spec, rng)
            runtimes[spec.key] = rt
            for w in spec.warnings:
                log.warning("ModelRouter %s: %s", spec.key, w)
        if len(routers) > 1:
            log.info("%d ModelRouters: a request goes to the one its Envoy route names in pointsman.router metadata, "
                     "else to the oldest (%s)", len(routers), routers[0].key)
        self.runtimes = runtimes
        self._order = tuple(spec.key for spec in routers)

    def endpoint_removed(self, key: str) -> None:
        for rt in self.runtimes.values():
            rt.endpoint_removed(key)

    def choose(self, metadata: Mapping[str, Mapping[str, object]]) -> RouterRuntime:
        ns, k = ROUTER_METADATA
        named = metadata.get(ns, {}).get(k)
        if isinstance(named, str) and named:
            rt = self.runtimes.get(named)
            if rt is None:
                raise SchedulingError(ErrorCode.NOT_FOUND, f"no ModelRouter {named!r} (named by {ns}.{k} metadata)"
                                                           f"; loaded: {', '.join(self.runtimes) or 'none'}")
            return rt
        return self.runtimes[self._order[0]]

    # ---- health ---------------------------------------------------------------------------------------------
    def pool_of(self, b: RouterBackend) -> str | None:
        """The datastore pool of a local backend: its pods (Kubernetes), else the endpoints-file pool named after
        its InferenceService (standalone)."""
        pb = self.router.table.pools.get(b.target.backend)
        if pb is None:
            return None
        if pb.key in self.router.materializer.unserved and b.service \
                and self.router.datastore.snapshot(b.service) is not None:
            return b.service
        return pb.pool

    def best_endpoint(self, rt: RouterRuntime, b: RouterBackend, inflight: Mapping[str, InflightLoad],
                      now: float | None = None) -> str | None:
        pool = self.pool_of(b)
        snap = self.router.datastore.snapshot(pool) if pool else None
        if snap is None:
            return None
        t = self.clock() if now is None else now
        eps = [e for e in snap.endpoints if rt.tracker.available(e.key, t)]
        if not eps:
            return None
        return min(eps, key=lambda e: (work(e, inflight.get(e.key, NO_LOAD).requests), e.key)).key

    class _Health:
        def __init__(self, owner: LLMKubeRouting, rt: RouterRuntime, now: float) -> None:
            self.owner, self.rt, self.now = owner, rt, now

        def problem(self, b: RouterBackend) -> str | None:
            owner, tracker, now = self.owner, self.rt.tracker, self.now
            if b.kind == "pool":
                pool = owner.pool_of(b)
                snap = owner.router.datastore.snapshot(pool) if pool else None
                if snap is None or not snap.endpoints:
                    return f"InferenceService {b.service} has no endpoints"
                if not any(tracker.available(e.key, now) for e in snap.endpoints):
                    return "every endpoint is quarantined"
                return None
            key = b.target.backend
            if not tracker.available(key, now):
                return f"quarantined ({tracker.state(key, now)})"
            p = owner.router.table.providers.get(key)
            if p is not None and p.auth is not None and owner.router.credentials.get(
                    p.namespace, p.auth.secret_name, p.auth.secret_key) is None:
                return f"its credential (Secret {p.auth.secret_name!r}, key {p.auth.secret_key!r}) is not loaded"
            return None

        def p95_ms(self, b: RouterBackend) -> float | None:
            return self.rt.latency.p95(b.name, self.now)

    # ---- the decision ---------------------------------------------------------------------------------------
    def decide(self, headers: Mapping[str, str], model: str, *, now: float, rng: random.Random,
               metadata: Mapping[str, Mapping[str, object]], body: Mapping[str, object] | None) -> ModelRouterDecision:
        rt = self.choose(metadata)
        spec = rt.spec
        f = features(headers, model, spec.classification_header, spec.sensitive)
        plan = decide(spec, f, self._Health(self, rt, now), rng)
        b = plan.backend
        rule = spec.route.rules[plan.rule.index] if not plan.rule.synthetic else Rule(
            plan.rule.name, plan.rule.index, Match(), (b.target,))
        d = ModelRouterDecision(route=spec.route, rule=rule, target=b.target, spec=spec, runtime=rt, plan=plan,
                                backend=b, owner=self, classifications=f.classifications)
        router = self.router
        if b.kind == "pool":
            pb = router.table.pools[b.target.backend]
            d.pool, d.resolved_pool, d.scheduler = pb, self.pool_of(b), rt.schedulers.get(b.name)
            d.remove_headers.append(router.provider_header)
        else:
            router.provider_target(d, headers, headers.get(":path", "/"))
        d.set_headers.extend((h, b.published) for h in self.gateway_headers)
        self._timeout(d, plan, body)
        self._mirrors(d, rt, plan, now)
        return d

    def _timeout(self, d: ModelRouterDecision, plan: Plan, body: Mapping[str, object] | None) -> None:
        cap = d.spec.response_header_timeout_s
        t = plan.rule.timeout_s or plan.backend.timeout_s or cap
        d.timeout_s = min(t, cap)
        if not (body is not None and body.get("stream") is True):
            d.set_headers.append((TIMEOUT_HEADER, str(max(1, round(d.timeout_s * 1000)))))

    def _mirrors(self, d: ModelRouterDecision, rt: RouterRuntime, plan: Plan, now: float) -> None:
        picked = []
        for b in plan.mirrors[:MAX_MIRRORS]:
            key = self.best_endpoint(rt, b, self.router.datastore.inflight.view(), now)
            if key is not None:
                picked.append((b.name, key))
        d.mirror_endpoints = picked
        if picked:
            d.set_headers.append((MIRRORS_HEADER, str(len(picked))))
            d.set_headers.extend((mirror_header(i), key) for i, (_, key) in enumerate(picked, 1))
        owned = {h for h, _ in d.set_headers}
        d.remove_headers.extend(h for h in RESERVED_HEADERS if h not in owned)  # a client never sets them

    # ---- the response path (a request observer, epp/request/observe.py) ---------------------------------------
    def decided(self, ex: RoutedRequest) -> _Followed | None:
        w = self.watch(ex.ctx, ex.result)
        return None if w is None else _Followed(w)

    def rejected(self, ex: object, code: str) -> None:
        pass

    def watch(self, ctx: object, result: SchedulingResult | None) -> StreamWatch | None:
        d = getattr(ctx, "route", None)
        if not isinstance(d, ModelRouterDecision) or d.runtime is None:
            return None
        rt: RouterRuntime = d.runtime
        fallbacks: tuple[str, ...] = ()
        if d.provider is not None:
            key, threshold = d.provider.key, BACKEND_THRESHOLD
        elif result is not None and result.targets:
            key, threshold, fallbacks = result.primary.key, POD_THRESHOLD, d.fallback_keys
        else:
            return None
        return StreamWatch(rt.tracker, key, threshold=threshold, clock=self.clock, idle_s=rt.spec.stream_idle_s,
                           latency=rt.latency, backend=d.backend.name, fallbacks=fallbacks)


class _Followed:
    """A quarantine watch as a follow of the request path."""

    __slots__ = ("w",)

    def __init__(self, w: StreamWatch) -> None:
        self.w = w

    def response_headers(self, ex: object, status: int, served: str | None) -> None:
        self.w.response_headers(status, served)

    def response_chunk(self, ex: object, size: int, end_of_stream: bool) -> None:
        self.w.response_chunk(end_of_stream)

    def closed(self, ex: object, usage: object) -> None:
        self.w.closed()

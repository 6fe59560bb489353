"""The routing layer the director consults after parsing and before choosing candidates.

`Router.decide(headers, model)` answers, for one request:
- which route and rule matched, the rule's split and the target it picked (weighted, from the injected RNG);
- for a pool target: the datastore pool to schedule in, the model the engine sees (the backend's `model`, unless
  the model named a LoRA adapter), the P/D scheduler when the pool pairs prefill and decode, the sticky-session
  binding, and how many fallback endpoints Envoy may retry on;
- for a provider target: no endpoint scheduling; the headers that send the request to the provider's cluster with
  its credential, the provider's path and model;
- or: no route names the model (None, and the request is scheduled as before when plain pools exist), or routes
  name it but no rule matched (404).
A model no route names goes to a dialect's runtime when one routes (LLMKube's ModelRouter; epp/routing/dialect.py).
A decision made for explain (`dry_run`) uses a copy of the RNG and changes nothing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from epp.fleet import Datastore
from epp.routing.decision import MAX_RETRIES_HEADER, RouteDecision
from epp.routing.dialect import DialectRuntime, make_runtimes
from epp.routing.dialects import DIALECTS
from epp.routing.matcher import select
from epp.routing.model import RoutingTable
from epp.routing.pools import PodSource, PoolMaterializer, pd_scheduler
from epp.routing.providers import (
    PROVIDER_HEADER,
    Credentials,
    client_headers_to_remove,
    credential_header,
    upstream_path,
)
from epp.routing.sticky import StickyTable
from scheduling.types import ErrorCode, SchedulingError

if TYPE_CHECKING:
    from scheduling.config import ModelScheduler

__all__ = ["MAX_RETRIES_HEADER", "RouteDecision", "Router"]

log = logging.getLogger(__name__)


class Router:
    def __init__(
        self,
        datastore: Datastore,
        rng: random.Random,
        *,
        credentials: Credentials | None = None,
        pods: PodSource | None = None,
        provider_header: str = PROVIDER_HEADER,
        on_decision: Callable[[RouteDecision], None] | None = None,
        gateway_headers: Sequence[str] = ("x-gateway-base-model-name", "x-ai-eg-model"),
    ) -> None:
        self.datastore = datastore
        self.rng = rng
        self.credentials = credentials or Credentials()
        self.provider_header = provider_header.lower()
        self.materializer = PoolMaterializer(datastore, pods)
        self.table = RoutingTable()
        self.on_decision = on_decision
        self._sticky: dict[str, StickyTable] = {}
        self._pd: dict[str, ModelScheduler] = {}  # group key -> scheduler
        # The dialects' run-time parts (LLMKube's ModelRouters), consulted for models no route names.
        self.runtimes: list[DialectRuntime] = make_runtimes(DIALECTS, self, gateway_headers=gateway_headers)
        datastore.on_endpoint_removed(self.endpoint_removed)

    # ---- configuration -------------------------------------------------------------------------------------
    def set_pods(self, pods: PodSource) -> None:
        self.materializer.pods = pods
        self.materializer.apply(self.table.pools)

    def apply(self, table: RoutingTable) -> None:
        """Make `table` current: backend pools follow it; sticky tables and P/D schedulers are kept when their
        backend did not change."""
        self.materializer.apply(table.pools)
        for key in sorted(self.materializer.unserved):
            if table.pools[key].kind == "InferenceService":
                log.info("%s: Pointsman is not watching Kubernetes; its endpoints are the --endpoints-file pool "
                         "named after the InferenceService", key)
                continue
            log.warning("%s selects pods, but Pointsman is not watching Kubernetes: it has no endpoints "
                        "(list spec.endpoints to run it standalone)", key)
        sticky = {}
        for key, b in table.pools.items():
            if b.sticky is not None:
                old = self._sticky.get(key)
                sticky[key] = old if old is not None and old.spec == b.sticky else StickyTable(b.sticky)
            if b.pd is not None and b.pd.group_key not in self._pd:
                self._pd[b.pd.group_key] = pd_scheduler(b.pd.group_key, self.rng)
        self._sticky = sticky
        self.table = table
        for rt in self.runtimes:
            rt.apply(table.objects(rt.name))

    def endpoint_removed(self, key: str) -> None:
        for t in self._sticky.values():
            t.endpoint_removed(key)
        for s in self._pd.values():
            s.endpoint_removed(key)
        for rt in self.runtimes:
            rt.endpoint_removed(key)

    def runtime(self, name: str) -> DialectRuntime:
        """A dialect's run-time part by its name (e.g. "llmkube")."""
        return next(rt for rt in self.runtimes if rt.name == name)

    @property
    def reserved_headers(self) -> tuple[str, ...]:
        """Request headers only Pointsman may set: removed from every request it does not set them on."""
        return (self.provider_header, *(h for rt in self.runtimes for h in rt.reserved_headers))

    def owns_pool(self, name: str) -> bool:
        return name in self.materializer.names

    def plain_pools(self) -> list[str]:
        """Pools that are not route backends (an InferencePool, an endpoints file)."""
        return [p for p in self.datastore.pool_names() if p not in self.materializer.names]

    def schedulers(self) -> list[ModelScheduler]:
        return list(self._pd.values())

    # ---- the decision --------------------------------------------------------------------------------------
    def decide(self, headers: Mapping[str, str], model: str, *, now: float, dry_run: bool = False,
               metadata: Mapping[str, Mapping[str, object]] | None = None, body: Mapping[str, object] | None = None,
               ) -> RouteDecision | None:
        """Raises SchedulingError: 404 (routes name the model but no rule matched, or nothing routes it and no plain
        pool exists; a target that does not exist), 400 (a path the provider does not take), 503 (a provider
        whose credential is not loaded; a ModelRouter that refuses the request).

        A model no route names goes to a dialect's runtime that routes (LLMKube's ModelRouter when one is loaded)."""
        path = headers.get(":path", "/")
        rng = random.Random() if dry_run else self.rng
        if dry_run:
            rng.setstate(self.rng.getstate())
        sel = select(self.table, model, path, headers, rng)
        if sel.route is None or sel.rule is None or sel.target is None:
            runtime = next((rt for rt in self.runtimes if rt.active()), None) if not sel.had_routes else None
            if runtime is not None:
                d: RouteDecision = runtime.decide(headers, model, now=now, rng=rng, metadata=metadata or {},
                                                  body=body)
                if self.on_decision is not None and not dry_run:
                    self.on_decision(d)
                return d
            if sel.had_routes:
                names = ", ".join(r.key for r in self.table.routes_for(model)[0])
                raise SchedulingError(ErrorCode.NOT_FOUND, f"no rule of route(s) {names} matches this request "
                                                           f"for model {model!r}")
            if model and self.plain_pools():
                return None  # not a routed model: scheduled in its pool as before
            raise SchedulingError(ErrorCode.NOT_FOUND, f"no route for model {model!r}")
        d = RouteDecision(route=sel.route, rule=sel.rule, target=sel.target, by_adapter=sel.by_adapter)
        d.remove_headers.extend(h for h in self.reserved_headers if h != self.provider_header)
        if sel.target.kind == "provider":
            self.provider_target(d, headers, path)
        else:
            self._pool(d, headers)
        if self.on_decision is not None and not dry_run:
            self.on_decision(d)
        return d

    def _missing(self, d: RouteDecision, what: str) -> SchedulingError:
        return SchedulingError(ErrorCode.NOT_FOUND, f"{what} {d.target.backend}, the target of {d.route.kind} "
                                                    f"{d.route.key} rule {d.rule.name!r}, does not exist")

    def _pool(self, d: RouteDecision, headers: Mapping[str, str]) -> None:
        b = self.table.pools.get(d.target.backend)
        if b is None:
            raise self._missing(d, "ModelServer")
        d.pool = b
        if d.by_adapter:
            d.base_model = b.model
        else:
            d.engine_model = b.model
        if b.pd is not None:
            d.scheduler = self._pd.get(b.pd.group_key)
        elif b.sticky is not None:
            d.sticky = self._sticky.get(b.key)
            if d.sticky is not None:
                d.session = d.sticky.key_hash(headers)
        d.remove_headers.append(self.provider_header)

    def provider_target(self, d: RouteDecision, headers: Mapping[str, str], path: str) -> None:
        """Make `d` (whose target is a provider backend) send the request to that provider."""
        p = self.table.providers.get(d.target.backend)
        if p is None:
            raise self._missing(d, "ExternalModelProvider")
        d.provider = p
        d.engine_model = p.model
        new_path = upstream_path(p, path)
        if new_path is None:
            raise SchedulingError(ErrorCode.BAD_REQUEST, f"provider type {p.provider_type} does not support path "
                                                         f"{path.split('?', 1)[0]!r}")
        sets: list[tuple[str, str]] = [(self.provider_header, p.cluster), (":path", new_path)]
        sensitive: set[str] = set()
        if p.auth is not None:
            cred = self.credentials.get(p.namespace, p.auth.secret_name, p.auth.secret_key)
            if cred is None:
                raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE,
                                      f"external provider {p.key} is not ready: its credential (Secret "
                                      f"{p.auth.secret_name!r}, key {p.auth.secret_key!r}) is not loaded")
            name, value = credential_header(p, cred)
            sets.append((name, value))
            sensitive.add(name)
        sets.extend(p.headers)
        d.set_headers = sets
        d.sensitive = frozenset(sensitive)
        d.remove_headers = client_headers_to_remove(p, headers, {k for k, _ in sets})

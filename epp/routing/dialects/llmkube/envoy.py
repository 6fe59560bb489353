"""Envoy config for LLMKube ModelRouters (the dialect's `envoy` hook), added by `epp envoy-config --routes-file`:

- shadow: clusters `pointsman-shadow-<i>` (i = 1 .. the most mirror targets of any shadow rule, at most 8), each an
  ORIGINAL_DST cluster that takes its host from the request header `x-pointsman-mirror-<i>` (the pod Pointsman
  picked for the i-th shadow backend), and one route per mirror count n ahead of the pool route, matching
  `x-pointsman-mirrors: n`, with the pool route's action plus Envoy request mirroring to clusters 1..n. Copies are
  fire-and-forget: Envoy discards their responses (Pointsman never sees them, so they never quarantine anything
  and are never charged to budgets); each copy carries `x-llmkube-shadow: true` (an upstream header filter on the
  shadow cluster); at most 4 run at once per shadow cluster, the rest are dropped and counted by Envoy
  (`cluster.pointsman-shadow-<i>.upstream_rq_pending_overflow`);
- stream idle timeout: the pool routes' `idle_timeout` is the ModelRouters' `proxy.streamIdleTimeout` (the
  largest; "0s" anywhere turns it off), so Envoy ends a stream that goes silent, which Pointsman quarantines;
- retries: as many as the longest fallback list of any rule (Pointsman sets `x-envoy-max-retries` per request).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from epp.routing.dialect import EnvoyFragments
from epp.routing.dialects.llmkube.model import SHADOW, ModelRouterSpec
from epp.routing.dialects.llmkube.runtime import MAX_MIRRORS, MIRRORS_HEADER, RESERVED_HEADERS, mirror_header

_T = "@type"
HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HEADER_MUTATION = "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
UPSTREAM_CODEC = "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"
SHADOW_HEADER = "x-llmkube-shadow"
SHADOW_CONCURRENCY = 4


def shadow_cluster_name(i: int) -> str:
    return f"pointsman-shadow-{i}"


def shadow_cluster(i: int, connect_timeout_s: float = 5.0) -> dict[str, Any]:
    mutations: list[dict[str, Any]] = [
        {"append": {"header": {"key": SHADOW_HEADER, "value": "true"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]
    mutations += [{"remove": h} for h in RESERVED_HEADERS]
    limit = SHADOW_CONCURRENCY
    return {
        "name": shadow_cluster_name(i),
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": f"{connect_timeout_s:g}s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": mirror_header(i)},
        "circuit_breakers": {"thresholds": [{"max_connections": limit, "max_pending_requests": limit,
                                             "max_requests": limit, "max_retries": 0}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            _T: HTTP_OPTS,
            "explicit_http_config": {"http_protocol_options": {}},
            "http_filters": [
                {"name": "envoy.filters.http.header_mutation",
                 "typed_config": {_T: HEADER_MUTATION, "mutations": {"request_mutations": mutations}}},
                {"name": "envoy.filters.http.upstream_codec", "typed_config": {_T: UPSTREAM_CODEC}},
            ],
        }},
    }


def mirror_count(routers: Sequence[ModelRouterSpec]) -> int:
    """The most shadow copies any rule may ask for."""
    n = max((len(r.backends) - 1 for spec in routers for r in spec.rules if r.strategy == SHADOW), default=0)
    return min(n, MAX_MIRRORS)


def max_fallbacks(routers: Sequence[ModelRouterSpec]) -> int:
    """The longest list of fallback backends any rule may give Envoy."""
    return max((len(r.backends) - 1 for spec in routers for r in spec.rules), default=0)


def idle_timeout(routers: Sequence[ModelRouterSpec]) -> float | None:
    """The pool routes' idle timeout: None (keep the config's), 0 (off) or seconds."""
    if not routers:
        return None
    values = [spec.stream_idle_s for spec in routers]
    return 0.0 if 0.0 in values else max(values)


def mirror_routes(base: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """For every base (pool) route, one copy per mirror count n..1 matching x-pointsman-mirrors."""
    out = []
    for count in range(n, 0, -1):
        for r in base:
            if "route" not in r or "cluster" not in r["route"]:
                continue
            m = copy.deepcopy(r)
            m["name"] = f"{r.get('name') or 'pool'}:mirror-{count}"
            m.setdefault("match", {"prefix": "/"}).setdefault("headers", []).append(
                {"name": MIRRORS_HEADER, "string_match": {"exact": str(count)}})
            m["route"]["request_mirror_policies"] = [
                {"cluster": shadow_cluster_name(i), "disable_shadow_host_suffix_append": True}
                for i in range(1, count + 1)]
            out.append(m)
    return out


def fragments(routers: Sequence[ModelRouterSpec]) -> EnvoyFragments:
    """What the ModelRouters need of Envoy (the dialect's `envoy` hook, epp/routing/dialect.py)."""
    mirrors = mirror_count(routers)
    return EnvoyFragments(
        clusters=[shadow_cluster(i) for i in range(1, mirrors + 1)],
        max_retries=max_fallbacks(routers),
        idle_timeout_s=idle_timeout(routers),
        extra_routes=(lambda base: mirror_routes(base, mirrors)) if mirrors else None,
    )

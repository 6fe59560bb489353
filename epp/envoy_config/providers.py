"""Envoy config for the routing layer, as plain-dict fragments that `epp envoy-config` adds to its bootstrap:

- one cluster per ExternalModelProvider: LOGICAL_DNS to the base URL's host and port, TLS with SNI, the certificate
  verified against a CA bundle (the system bundle by default, `--provider-ca-file` to change it) and the host name
  (a DNS or IP SAN), no verification when the provider sets `insecureSkipVerify` (still TLS: never plain HTTP);
- one route per provider, ahead of the pool route, matching the provider header (`x-pointsman-provider: <cluster>`)
  that only Pointsman sets (it overwrites or removes a client's copy on every request); Host is rewritten to the
  provider's, and the provider header is not sent upstream;
- on the pool route, a retry policy when some ModelServer asks for retries: Envoy retries on 5xx, resets and
  connection failures, as many times as Pointsman allows per request (`x-envoy-max-retries`, set to the number of
  fallback endpoints it listed in envoy.lb metadata; the override_host policy takes them in order). ext_proc is
  allowed to set that one x-envoy header through its mutation rules.

Dialects add their own fragments (`Dialect.envoy`, epp/routing/dialect.py: LLMKube's shadow mirrors and stream
idle timeout). `RouteFragments.apply(bootstrap)` edits a rendered bootstrap dict in place (the hook in
epp/envoy_config/__init__.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp.routing import PROVIDER_HEADER, EnvoyFragments, PoolBackend, ProviderBackend, RoutingTable

SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
_T = "@type"
TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
RETRY_ON = "5xx,reset,connect-failure,refused-stream"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def provider_cluster(p: ProviderBackend, ca_file: str, connect_timeout_s: float = 5.0) -> dict[str, Any]:
    if not p.tls:
        return _plain_cluster(p, connect_timeout_s)
    common: dict[str, Any] = {"alpn_protocols": ["h2", "http/1.1"]}
    if not p.insecure_skip_verify:
        common["validation_context"] = {
            "trusted_ca": {"filename": ca_file},
            "match_typed_subject_alt_names": [
                {"san_type": "IP_ADDRESS" if _is_ip(p.host) else "DNS", "matcher": {"exact": p.host}}
            ],
        }
    tls: dict[str, Any] = {_T: TLS, "common_tls_context": common}
    if not _is_ip(p.host):
        tls["sni"] = p.host
    return {
        "name": p.cluster,
        "type": "LOGICAL_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": f"{connect_timeout_s:g}s",
        "load_assignment": {
            "cluster_name": p.cluster,
            "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": p.host, "port_value": p.port}},
                "hostname": p.host,
            }}]}],
        },
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                _T: HTTP_OPTS,
                "auto_config": {"http_protocol_options": {}, "http2_protocol_options": {}},
            }
        },
    }


def _plain_cluster(p: ProviderBackend, connect_timeout_s: float) -> dict[str, Any]:
    """A plain-HTTP provider (an in-cluster LiteLLM proxy, as LLMKube allows): no TLS, HTTP/1.1."""
    return {
        "name": p.cluster,
        "type": "LOGICAL_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": f"{connect_timeout_s:g}s",
        "load_assignment": {"cluster_name": p.cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": p.host, "port_value": p.port}}, "hostname": p.host}}]}]},
    }


def provider_route(p: ProviderBackend, header: str, timeout_s: int) -> dict[str, Any]:
    host = p.host if p.port == (443 if p.tls else 80) else f"{p.host}:{p.port}"
    return {
        "name": f"provider:{p.key}",
        "match": {"prefix": "/", "headers": [{"name": header, "string_match": {"exact": p.cluster}}]},
        "route": {"cluster": p.cluster, "host_rewrite_literal": host, "timeout": f"{timeout_s}s"},
        "request_headers_to_remove": [header],
    }


@dataclass
class RouteFragments:
    clusters: list[dict[str, Any]] = field(default_factory=list)
    routes: list[dict[str, Any]] = field(default_factory=list)  # ahead of the pool route
    max_retries: int = 0  # > 0: the pool route gets a retry policy
    idle_timeout_s: float | None = None  # a dialect's stream idle timeout on the pool routes (0: off)
    # Dialects' routes made from the pool routes, put ahead of them (LLMKube's shadow mirrors).
    extra_routes: list[Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]] = field(default_factory=list)

    def apply(self, bootstrap: dict[str, Any]) -> dict[str, Any]:
        """Add the fragments to a bootstrap rendered by epp.envoy_config (in place; returned for chaining)."""
        static = bootstrap["static_resources"]
        static["clusters"].extend(self.clusters)
        for listener in static["listeners"]:
            for chain in listener["filter_chains"]:
                for f in chain["filters"]:
                    hcm = f.get("typed_config", {})
                    if "route_config" not in hcm:
                        continue
                    for vh in hcm["route_config"]["virtual_hosts"]:
                        if self.max_retries > 0:
                            for r in vh["routes"]:
                                r["route"]["retry_policy"] = {"retry_on": RETRY_ON, "num_retries": self.max_retries}
                        made = [r for make in self.extra_routes for r in make(vh["routes"])]
                        vh["routes"][:0] = self.routes + made
                        if self.idle_timeout_s is not None:
                            for r in vh["routes"]:
                                r["route"]["idle_timeout"] = f"{self.idle_timeout_s:g}s"
                    for hf in hcm.get("http_filters", []):
                        if hf.get("name") == "envoy.filters.http.ext_proc":
                            # Pointsman sets x-envoy-max-retries (and nothing else under x-envoy-).
                            hf["typed_config"]["mutation_rules"] = {"allow_envoy": True}
        return bootstrap


SET_METADATA = "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config"
POOL_NAMESPACE = "pointsman"


def name_pools(bootstrap: dict[str, Any], pools_by_route: dict[str, str]) -> dict[str, Any]:
    """Several pools behind one Envoy: each route (by its `name`) tells Pointsman its pool in dynamic metadata
    `pointsman.pool` (a per-route set_metadata config; the filter runs before ext_proc, which forwards the
    namespace). Edits the bootstrap in place."""
    for listener in bootstrap["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                hcm = f.get("typed_config", {})
                if "route_config" not in hcm:
                    continue
                for vh in hcm["route_config"]["virtual_hosts"]:
                    for r in vh["routes"]:
                        pool = pools_by_route.get(r.get("name", ""))
                        if pool is not None:
                            r.setdefault("typed_per_filter_config", {})["envoy.filters.http.set_metadata"] = {
                                _T: SET_METADATA, "metadata_namespace": POOL_NAMESPACE, "value": {"pool": pool}}
                filters = hcm["http_filters"]
                at = next(i for i, hf in enumerate(filters) if hf["name"] == "envoy.filters.http.ext_proc")
                filters.insert(at, {"name": "envoy.filters.http.set_metadata", "typed_config": {_T: SET_METADATA}})
                opts = filters[at + 1]["typed_config"].setdefault("metadata_options", {})
                fwd = opts.setdefault("forwarding_namespaces", {}).setdefault("untyped", [])
                if POOL_NAMESPACE not in fwd:
                    fwd.append(POOL_NAMESPACE)
    return bootstrap


def build_fragments(
    providers: Sequence[ProviderBackend],
    pools: Sequence[PoolBackend] = (),
    *,
    header: str = PROVIDER_HEADER,
    ca_file: str = SYSTEM_CA,
    timeout_s: int = 600,
    dialects: Sequence[EnvoyFragments] = (),
) -> RouteFragments:
    ordered = sorted(providers, key=lambda p: p.cluster)
    idle = [f.idle_timeout_s for f in dialects if f.idle_timeout_s is not None]
    return RouteFragments(
        clusters=[provider_cluster(p, ca_file) for p in ordered] + [c for f in dialects for c in f.clusters],
        routes=[provider_route(p, header.lower(), timeout_s) for p in ordered],
        max_retries=max([b.retries for b in pools] + [f.max_retries for f in dialects] + [0]),
        idle_timeout_s=(0.0 if 0.0 in idle else max(idle)) if idle else None,
        extra_routes=[f.extra_routes for f in dialects if f.extra_routes is not None],
    )


def table_fragments(table: RoutingTable, *, header: str = PROVIDER_HEADER, ca_file: str = SYSTEM_CA
                    ) -> RouteFragments:
    """The fragments a routing table needs: the shared ones, and each dialect's for its own objects."""
    from epp.routing.dialects import DIALECTS

    dialects = [d.envoy(table.objects(d.name)) for d in DIALECTS if d.envoy is not None and table.objects(d.name)]
    return build_fragments(list(table.providers.values()), list(table.pools.values()), header=header,
                           ca_file=ca_file, dialects=dialects)


def fragments_from_files(paths: Sequence[str | Path], *, header: str = PROVIDER_HEADER, ca_file: str = SYSTEM_CA
                         ) -> tuple[RouteFragments, list[tuple[str, int]], list[str]]:
    """Read route documents: (fragments, the static endpoints of every ModelServer, errors). Errors name the
    document, the field and what was expected; the caller decides whether they are fatal."""
    from epp.routing import DocumentSet, RouteConfigError, read_yaml

    docs = DocumentSet()
    errors: list[str] = []
    for path in paths:
        try:
            docs.replace(f"file:{path}", read_yaml(Path(path).read_text(), str(path)))
        except (OSError, RouteConfigError) as e:
            errors.append(f"{path}: {e}")
    errors.extend(docs.errors.values())
    table = docs.table()
    endpoints = sorted({(e.address, e.port) for b in table.pools.values() for e in b.endpoints})
    return table_fragments(table, header=header, ca_file=ca_file), endpoints, errors

"""Envoy bootstrap configs that put Pointsman in front of a pool, built from envoy-data-plane's typed messages.

Variants (see docs/envoy.md for when to use which), all with the ext_proc filter in FULL_DUPLEX_STREAMED and
trailers SEND (as GIE's reference config):
- `original-dst`: an ORIGINAL_DST cluster routed by the `x-gateway-destination-endpoint` header (one address).
- `override-host`: the pool's endpoints under the override_host load-balancing policy reading
  `envoy.lb/x-gateway-destination-endpoint` metadata (a comma list, later entries for retries), with
  `metadata_options.receiving_namespaces` set so the metadata is not dropped, and the served host written back to
  `envoy.lb/x-gateway-destination-endpoint-served`. The endpoints are a static list written once, or with
  `eds=True` an EDS cluster that Pointsman keeps up to date (epp/xds) over the `epp` cluster.

Failure mode (`spec.failure_mode`): `closed` (default) fails a request Pointsman cannot route; `open` sets the
ext_proc filter's `failure_mode_allow`, health-checks Pointsman (gRPC health, no panic routing, 250 ms connect
timeout) and lets the override_host fallback policy (least request) serve the pool while Pointsman is away.

`render(spec)` gives the bootstrap as a dict (snake_case field names, as Envoy's YAML uses), `render_yaml(spec)`
as text, `build_bootstrap(spec)` as the typed `Bootstrap` message. envoy-data-plane takes about a second to
import, so the typed builders load on first use only: importing this package for `EnvoyConfigSpec` is cheap, and
nothing on the request path imports it (measured: bench/bench_import_cost.py).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from epp.envoy_config.spec import VARIANTS, EnvoyConfigSpec, add_observe_flags, parse_collector
from epp.extras import lazy_exports, require

if TYPE_CHECKING:
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap

    from epp.envoy_config.providers import RouteFragments, fragments_from_files

_Tree = TypeVar("_Tree")  # a JSON tree (dicts, lists, scalars), edited in place and returned

# Imported on first use (PEP 562): the providers read route documents with the routing layer.
_LAZY = {"RouteFragments": "providers", "fragments_from_files": "providers"}

__all__ = ["VARIANTS", "EnvoyConfigSpec", "RouteFragments", "add_observe_flags", "build_bootstrap", "fragments_from_files",
           "parse_collector", "render", "render_yaml"]

# proto3 leaves fields at their default out of JSON; these are written anyway because a reader of the file
# should see them (fail-closed is a security property: no pick, no upstream).
_EXPLICIT_FALSE = ("failure_mode_allow", "allow_mode_override")


def build_bootstrap(spec: EnvoyConfigSpec) -> Bootstrap:
    spec.check()
    require("envoy-config", "envoy_data_plane", "rendering an Envoy config")
    with warnings.catch_warnings():  # the generated classes trip pydantic deprecation warnings at import
        warnings.simplefilter("ignore", DeprecationWarning)
        from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
        from envoy_data_plane.envoy.config.core.v3 import Node

        from epp.envoy_config.clusters import epp_cluster, pool_cluster
        from epp.envoy_config.listener import connection_manager, ext_proc_filter, listener, socket
        from epp.envoy_config.observe import apply as add_observability
        from epp.envoy_config.observe import collector_cluster

    hcm = connection_manager(spec, ext_proc_filter(spec))
    add_observability(spec, hcm)  # Envoy's tracing, the access log with the decision id
    collector = collector_cluster(spec)
    return Bootstrap(
        # xDS needs a node identity; Pointsman logs it for every EDS stream.
        node=Node(id=spec.node_id, cluster=spec.node_cluster),
        admin=Admin(address=socket("127.0.0.1", spec.admin_port)),
        static_resources=BootstrapStaticResources(
            listeners=[listener(spec, hcm)],
            clusters=[epp_cluster(spec), pool_cluster(spec), *([collector] if collector is not None else [])],
        ),
    )


def _with_explicit_defaults(node: _Tree) -> _Tree:
    if isinstance(node, dict):
        if node.get("@type", "").endswith(".ext_proc.v3.ExternalProcessor"):
            for key in _EXPLICIT_FALSE:
                node.setdefault(key, False)
        if node.get("healthy_panic_threshold") == {}:
            node["healthy_panic_threshold"] = {"value": 0.0}  # no panic routing (proto3 writes 0 as {})
        for value in node.values():
            _with_explicit_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _with_explicit_defaults(value)
    return node


def render(spec: EnvoyConfigSpec) -> dict[str, Any]:
    """The bootstrap as a plain dict in Envoy's YAML form (proto JSON with snake_case names)."""
    import betterproto2

    doc = build_bootstrap(spec).to_dict(casing=betterproto2.Casing.SNAKE)
    # Proto field order would put admin last; a reader looks for it first.
    ordered: dict[str, Any] = {k: doc.pop(k) for k in ("node", "admin") if k in doc}
    bootstrap: dict[str, Any] = _with_explicit_defaults({**ordered, **doc})
    if spec.route_fragments is not None:  # the routing layer's provider clusters and routes, pool retries
        spec.route_fragments.apply(bootstrap)
    return bootstrap


def render_yaml(spec: EnvoyConfigSpec) -> str:
    mode = f"{spec.variant}, EDS from Pointsman" if spec.eds else spec.variant
    header = f"# Envoy bootstrap for Pointsman ({mode}); generated by `epp envoy-config`.\n"
    return header + yaml.safe_dump(render(spec), sort_keys=False)


__getattr__ = lazy_exports(__name__, _LAZY)

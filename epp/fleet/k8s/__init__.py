"""Kubernetes discovery: InferencePool, its pods, InferenceObjectives and InferenceModelRewrites; the replica bus's
peers (the EndpointSlices of a headless Service, epp/bus/peers.py).

Everything the watchers read is listed in WATCHED_RESOURCES; a reflector can only be built for a resource listed
there, and tests/deploy checks that the RBAC in deploy/ grants exactly these. GIE_FLAGS lists the command-line
flags the Deployment in deploy/ passes (GIE EPP names); the CLI must accept all of them. Both are in resources.py
(no kubernetes import); the watchers and the client load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.fleet.k8s.convert import obj_name, parse_ports, parse_selector
    from epp.fleet.k8s.discovery import (
        list_call,
        make_api_client,
        start_pool_discovery,
        start_selector_discovery,
    )
    from epp.fleet.k8s.multipool import MultiPoolDiscovery
    from epp.fleet.k8s.pods import PodPools
    from epp.fleet.k8s.reflector import Reflector, ReflectorOptions
    from epp.fleet.k8s.resources import (
        ENDPOINT_SLICE,
        EXTERNAL_MODEL_PROVIDER,
        GIE_FLAGS,
        INFERENCE_MODEL_REWRITE,
        INFERENCE_OBJECTIVE,
        INFERENCE_POOL,
        INFERENCE_POOL_V1ALPHA2,
        KTHENA_GROUP,
        MODEL_ROUTE,
        MODEL_ROUTER,
        MODEL_SERVER,
        POD,
        POOL_RESOURCES,
        ROUTE_RESOURCES,
        SECRET,
        WATCH_VERBS,
        WATCHED_RESOURCES,
        Resource,
        pool_resource,
    )

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the
# resource table loads without the kubernetes package.
_LAZY = {
    "obj_name": "convert", "parse_ports": "convert", "parse_selector": "convert",
    "list_call": "discovery", "make_api_client": "discovery", "start_pool_discovery": "discovery",
    "start_selector_discovery": "discovery",
    "MultiPoolDiscovery": "multipool",
    "PodPools": "pods",
    "Reflector": "reflector", "ReflectorOptions": "reflector",
    "ENDPOINT_SLICE": "resources", "EXTERNAL_MODEL_PROVIDER": "resources", "GIE_FLAGS": "resources",
    "INFERENCE_MODEL_REWRITE": "resources", "INFERENCE_OBJECTIVE": "resources", "INFERENCE_POOL": "resources",
    "INFERENCE_POOL_V1ALPHA2": "resources", "KTHENA_GROUP": "resources", "MODEL_ROUTE": "resources",
    "MODEL_ROUTER": "resources", "MODEL_SERVER": "resources", "POD": "resources", "POOL_RESOURCES": "resources",
    "ROUTE_RESOURCES": "resources", "Resource": "resources", "SECRET": "resources", "WATCHED_RESOURCES": "resources",
    "WATCH_VERBS": "resources", "pool_resource": "resources",
}

__all__ = ["ENDPOINT_SLICE", "EXTERNAL_MODEL_PROVIDER", "GIE_FLAGS", "INFERENCE_MODEL_REWRITE",
           "INFERENCE_OBJECTIVE", "INFERENCE_POOL", "INFERENCE_POOL_V1ALPHA2", "KTHENA_GROUP", "MODEL_ROUTE",
           "MODEL_ROUTER", "MODEL_SERVER", "MultiPoolDiscovery", "POD", "POOL_RESOURCES", "PodPools",
           "ROUTE_RESOURCES", "Reflector", "ReflectorOptions", "Resource", "SECRET", "WATCHED_RESOURCES", "WATCH_VERBS", "list_call",
           "make_api_client", "obj_name", "parse_ports", "parse_selector", "pool_resource", "start_pool_discovery",
           "start_selector_discovery"]


__getattr__ = lazy_exports(__name__, _LAZY)

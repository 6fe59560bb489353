"""The routing layer: routes -> rules -> weighted targets, each a pool of endpoints or an external provider.

The shared core: model.py (the typed route model every dialect compiles to) · matcher.py (pure matching, injected
RNG) · validate.py (field readers that name the document, the field and what was expected) · documents.py
(per-document compile by the document's dialect, last good version) · router.py (the decision the request path
applies; decision.py holds it) · pools.py (backends as datastore pools, the P/D scheduler) · sticky.py ·
providers.py (external providers, credentials) · service.py (files, Kubernetes, metrics) · k8s.py (the Kubernetes
watch) · metrics.py.

Dialects (dialect.py says what one declares; dialects/__init__.py registers them): dialects/kthena (Kthena's
ModelRoute, ModelServer, ExternalModelProvider) and dialects/llmkube (LLMKube's ModelRouter, with its runtime).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.routing.decision import RouteDecision
    from epp.routing.dialect import Dialect, EnvoyFragments, StackExample
    from epp.routing.dialects import DIALECTS
    from epp.routing.documents import DocumentSet, read_yaml
    from epp.routing.model import PoolBackend, ProviderBackend, RouteConfigError, RoutingTable
    from epp.routing.providers import CREDENTIAL_HEADERS, PROVIDER_HEADER
    from epp.routing.router import Router
    from epp.routing.service import RoutingService

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the CLI
# reads epp.routing.settings without loading the routing service.
_LAZY = {
    "RouteDecision": "decision",
    "Dialect": "dialect", "EnvoyFragments": "dialect", "StackExample": "dialect",
    "DIALECTS": "dialects",
    "DocumentSet": "documents", "read_yaml": "documents",
    "PoolBackend": "model", "ProviderBackend": "model", "RouteConfigError": "model", "RoutingTable": "model",
    "CREDENTIAL_HEADERS": "providers", "PROVIDER_HEADER": "providers",
    "Router": "router",
    "RoutingService": "service",
}

__all__ = ["CREDENTIAL_HEADERS", "DIALECTS", "Dialect", "DocumentSet", "EnvoyFragments", "PROVIDER_HEADER",
           "PoolBackend", "ProviderBackend", "RouteConfigError", "RouteDecision", "Router", "RoutingService",
           "RoutingTable", "StackExample", "read_yaml"]


__getattr__ = lazy_exports(__name__, _LAZY)

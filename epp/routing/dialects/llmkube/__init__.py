"""LLMKube's ModelRouter (inference.llmkube.dev/v1alpha1), with its own runtime (docs/coming-from-llmkube.md).

documents.py + backends.py read a ModelRouter: its InferenceService backends compile to PoolBackends and its
external ones to ProviderBackends (the shared model); the router itself is a `ModelRouterSpec` (model.py), kept
under this dialect's name. At run time (runtime.py) a model no route names goes to the ModelRouter: match.py
decides the rule and backend (classification.py guards sensitive requests), balance.py schedules a backend's pods,
quarantine.py follows the responses; envoy.py adds the shadow mirrors, stream idle timeout and retries to Envoy's
config; example.py is `epp stack --example llmkube`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from epp.fleet.k8s import MODEL_ROUTER
from epp.routing.dialect import Dialect, EnvoyFragments, StackExample
from epp.routing.dialects.llmkube import example
from epp.routing.dialects.llmkube.documents import GROUP, compile_document

if TYPE_CHECKING:
    from epp.routing.dialects.llmkube.runtime import LLMKubeRouting
    from epp.routing.router import Router


def _runtime(router: Router, *, gateway_headers: Sequence[str]) -> LLMKubeRouting:
    from epp.routing.dialects.llmkube.runtime import LLMKubeRouting

    return LLMKubeRouting(router, gateway_headers=gateway_headers)


def _envoy(routers: tuple[Any, ...]) -> EnvoyFragments:
    from epp.routing.dialects.llmkube.envoy import fragments

    return fragments(routers)


DIALECT = Dialect(
    name="llmkube",
    group=GROUP,
    resources=(MODEL_ROUTER,),
    compile=compile_document,
    runtime=_runtime,
    envoy=_envoy,
    example=StackExample(help="an LLMKube ModelRouter over two InferenceServices, with budgets",
                         describe=example.describe, routes=example.routes, pools=example.pools, ready=example.ready),
    page="docs/coming-from-llmkube.md",
)

__all__ = ["DIALECT"]

"""Kthena's routing documents (networking.serving.volcano.sh/v1alpha1): ModelRoute, ModelServer and
ExternalModelProvider, compiled onto the shared route model (docs/coming-from-kthena.md).

documents.py reads a document (ModelRoute -> Route); backends.py reads ModelServer -> PoolBackend and
ExternalModelProvider -> ProviderBackend; example.py is `epp stack --example kthena`. Everything at run time is the
shared router's (epp/routing/router.py), and its Envoy fragments (provider clusters, retries) are the shared ones.
"""

from epp.fleet.k8s import EXTERNAL_MODEL_PROVIDER, MODEL_ROUTE, MODEL_SERVER
from epp.routing.dialect import Dialect, StackExample
from epp.routing.dialects.kthena import example
from epp.routing.dialects.kthena.documents import GROUP, compile_document

DIALECT = Dialect(
    name="kthena",
    group=GROUP,
    resources=(MODEL_ROUTE, MODEL_SERVER, EXTERNAL_MODEL_PROVIDER),
    compile=compile_document,
    example=StackExample(help="a Kthena ModelRoute over two ModelServers", describe=example.describe,
                         routes=example.routes, pools=None, ready=example.ready),
    page="docs/coming-from-kthena.md",
)

__all__ = ["DIALECT"]

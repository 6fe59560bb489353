"""The Kubernetes resources Pointsman watches, and the flags the Deployment in deploy/ passes (GIE_FLAGS); the
package docstring (epp/fleet/k8s/__init__.py) says how they are used."""


from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resource:
    group: str  # "" for the core API group
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


POD = Resource("", "v1", "pods", "Pod")
INFERENCE_POOL = Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
# The older InferencePool (GIE up to v0.5), which many installations still run: `--pool-group
# inference.networking.x-k8s.io`.
INFERENCE_POOL_V1ALPHA2 = Resource("inference.networking.x-k8s.io", "v1alpha2", "inferencepools", "InferencePool")
POOL_RESOURCES: dict[str, Resource] = {r.group: r for r in (INFERENCE_POOL, INFERENCE_POOL_V1ALPHA2)}
INFERENCE_OBJECTIVE = Resource("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective")
INFERENCE_MODEL_REWRITE = Resource(
    "inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"
)

# Kthena's routing documents (`--watch-routes`) and the Secrets their ExternalModelProviders name.
KTHENA_GROUP = "networking.serving.volcano.sh"
MODEL_ROUTE = Resource(KTHENA_GROUP, "v1alpha1", "modelroutes", "ModelRoute")
MODEL_SERVER = Resource(KTHENA_GROUP, "v1alpha1", "modelservers", "ModelServer")
EXTERNAL_MODEL_PROVIDER = Resource(KTHENA_GROUP, "v1alpha1", "externalmodelproviders", "ExternalModelProvider")
SECRET = Resource("", "v1", "secrets", "Secret")
# LLMKube's ModelRouter (`--watch-routes` too; docs/coming-from-llmkube.md).
MODEL_ROUTER = Resource("inference.llmkube.dev", "v1alpha1", "modelrouters", "ModelRouter")
# The replica bus finds its peers in the EndpointSlices of a headless Service (`--bus-service`).
ENDPOINT_SLICE = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")

# Every resource a watcher reads, and the verbs it needs (RBAC must grant these, and nothing more is needed).
WATCH_VERBS: tuple[str, ...] = ("get", "list", "watch")
WATCHED_RESOURCES: tuple[Resource, ...] = (
    POD, INFERENCE_POOL, INFERENCE_POOL_V1ALPHA2, INFERENCE_OBJECTIVE, INFERENCE_MODEL_REWRITE, ENDPOINT_SLICE
)
# What `--watch-routes` reads on top (deploy/kthena grants it; Secrets only by name, one watch per Secret named by
# an ExternalModelProvider or a ModelRouter's external backend).
ROUTE_RESOURCES: tuple[Resource, ...] = (MODEL_ROUTE, MODEL_SERVER, EXTERNAL_MODEL_PROVIDER, MODEL_ROUTER, SECRET)


def pool_resource(group: str) -> Resource:
    """The InferencePool resource of `--pool-group`; ValueError naming the supported groups otherwise."""
    res = POOL_RESOURCES.get(group)
    if res is None:
        raise ValueError(f"--pool-group {group!r} is not an InferencePool API group; expected one of "
                         f"{', '.join(POOL_RESOURCES)}")
    return res

# GIE EPP flags used by deploy/ (and expected by operators); the CLI accepts all of them. Every flag other EPPs
# define, and what Pointsman does with it: epp/cmd/foreign.py FOREIGN_FLAGS (tests/deploy checks this is a subset).
GIE_FLAGS: tuple[str, ...] = (
    "--pool-name",
    "--pool-namespace",
    "--pool-group",
    "--config-file",
    "--config-text",
    "--grpc-port",
    "--grpc-health-port",
    "--metrics-port",
    "--refresh-metrics-interval",
    "--metrics-staleness-threshold",
    "--endpoint-selector",
    "--endpoint-target-ports",
    "--secure-serving",
    "--cert-path",
    "--metrics-endpoint-auth",
    "--v",
)

__all__ = [
    "ENDPOINT_SLICE",
    "EXTERNAL_MODEL_PROVIDER",
    "GIE_FLAGS",
    "INFERENCE_MODEL_REWRITE",
    "INFERENCE_OBJECTIVE",
    "INFERENCE_POOL",
    "INFERENCE_POOL_V1ALPHA2",
    "KTHENA_GROUP",
    "MODEL_ROUTE",
    "MODEL_ROUTER",
    "MODEL_SERVER",
    "POD",
    "POOL_RESOURCES",
    "ROUTE_RESOURCES",
    "Resource",
    "SECRET",
    "WATCHED_RESOURCES",
    "WATCH_VERBS",
    "pool_resource",
]

"""Pool backends as datastore pools: static endpoints directly, pods through a Kubernetes pod source; and the P/D
scheduler a pool with prefill/decode pairing runs.

Every endpoint of a backend carries:
- `llm-d.ai/engine-type` from the backend's engine (the scraper picks the metrics parser by it);
- with P/D pairing, `llm-d.ai/role` prefill / decode / both from the pairing's labels (an endpoint matching neither
  is not part of the pool), and the pod's own `groupKey` label, by which decode and prefill pair up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from epp.fleet import Datastore, PoolSpec
from epp.routing.model import PoolBackend
from scheduling.types import Endpoint, endpoint_key

if TYPE_CHECKING:
    from scheduling.config import ModelScheduler

ENGINE_LABEL = "llm-d.ai/engine-type"
ROLE_LABEL = "llm-d.ai/role"
Decorate = Callable[[Endpoint], "Endpoint | None"]


class PodSource(Protocol):
    """Pools of pods selected by labels (epp.fleet.k8s.pods.PodPools implements it)."""

    def set_pool(self, spec: PoolSpec, decorate: Decorate | None = None) -> None: ...
    def remove_pool(self, name: str) -> None: ...


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def decorator(backend: PoolBackend) -> Decorate:
    pd = backend.pd

    def decorate(ep: Endpoint) -> Endpoint | None:
        labels = dict(ep.labels)
        labels[ENGINE_LABEL] = backend.engine
        if pd is not None:
            prefill = _matches(labels, pd.prefill_labels)
            decode = _matches(labels, pd.decode_labels)
            if not prefill and not decode:
                return None
            labels[ROLE_LABEL] = "both" if prefill and decode else "prefill" if prefill else "decode"
        return Endpoint(ep.key, ep.address, ep.port, ep.name, ep.namespace or backend.namespace, labels,
                        ep.models, ep.metrics)

    return decorate


def static_endpoints(backend: PoolBackend) -> list[Endpoint]:
    decorate = decorator(backend)
    ms_name = backend.key.split("/", 1)[1]
    out = []
    for se in backend.endpoints:
        ep = decorate(Endpoint(endpoint_key(se.address, se.port), se.address, se.port, f"{ms_name}/{se.name}",
                               backend.namespace, dict(se.labels)))
        if ep is not None:
            out.append(ep)
    return out


def pool_spec(backend: PoolBackend) -> PoolSpec:
    return PoolSpec(name=backend.pool, namespace=backend.namespace, selector=dict(backend.selector or {}),
                    target_ports=(backend.port,) if backend.port else (), app_protocol=backend.protocol)


def pd_scheduler(group_key: str, rng: random.Random) -> ModelScheduler:
    """Decode first (decode-filter), then prefill only among endpoints of the decode pick's group."""
    from scheduling.config import load_scheduler

    scorers = [("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3)]
    doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "pd-profile-handler", "parameters": {"decider": "always", "pdGroupLabel": group_key}},
            {"type": "decode-filter"}, {"type": "prefill-filter"},
            *({"type": t} for t, _ in scorers),
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {"name": role, "plugins": [{"pluginRef": f"{role}-filter"},
                                       *({"pluginRef": t, "weight": w} for t, w in scorers),
                                       {"pluginRef": "max-score-picker"}]}
            for role in ("decode", "prefill")
        ],
    }
    return load_scheduler([doc], rng=rng, timer=time.perf_counter, name=f"P/D pairing by {group_key}")


class PoolMaterializer:
    """Keeps the datastore's backend pools equal to the routing table's pool backends (the one writer of them)."""

    def __init__(self, datastore: Datastore, pods: PodSource | None = None) -> None:
        self.datastore = datastore
        self.pods = pods
        self.names: set[str] = set()  # datastore pools this writer owns
        self._applied: dict[str, PoolBackend] = {}
        self.unserved: set[str] = set()  # backends selecting pods while nothing watches pods

    def apply(self, backends: Mapping[str, PoolBackend]) -> None:
        want = {b.pool: b for b in backends.values()}
        for name in sorted(self.names - set(want)):
            if self.pods is not None:
                self.pods.remove_pool(name)
            self.datastore.remove_pool(name)
            self._applied.pop(name, None)
        self.names = set(want)
        self.unserved = set()
        for name, b in want.items():
            if b.selector and self.pods is None:
                self.unserved.add(b.key)
                continue
            if self._applied.get(name) == b:
                continue
            if b.selector:
                assert self.pods is not None
                self.pods.set_pool(pool_spec(b), decorator(b))
            else:
                self.datastore.set_pool(pool_spec(b), static_endpoints(b))
            self._applied[name] = b

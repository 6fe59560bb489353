"""Many pools over one pod watch: every pod of the namespace, and for each pool the endpoints of the pods its selector
picks (Ready, addressed, not terminating; one per target port; the active-ports annotation honoured).

Used when one Pointsman serves several pools: InferencePools whose endpointPickerRef names its Service, and route
backends that select pods (Kthena ModelServers). A pool may carry a `decorate(endpoint) -> endpoint | None` that adds
labels (engine, P/D role) or leaves the endpoint out. Pod bursts are coalesced into one write per pool per loop
iteration; `synced` is set once the first pod LIST is in.

    pods = PodPools(datastore, api, "default"); pods.start()
    pods.set_pool(PoolSpec("llama", "default", {"app": "vllm"}, (8000,)))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.k8s.convert import matches, obj_name, pod_endpoints
from epp.fleet.k8s.reflector import Reflector
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from typing_extensions import Unpack

    from epp.fleet.k8s.reflector import ReflectorOptions

log = logging.getLogger(__name__)

Decorate = Callable[[Endpoint], "Endpoint | None"]


class PodPools:
    def __init__(self, datastore: Datastore, api: ApiClient, namespace: str,
                 **reflector_opts: Unpack[ReflectorOptions]) -> None:
        from epp.fleet.k8s.discovery import list_call
        from epp.fleet.k8s.resources import POD

        self.datastore = datastore
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, tuple[PoolSpec, Decorate | None]] = {}
        self.synced = asyncio.Event()
        self._dirty: set[str] = set()
        self._flush_scheduled = False
        self.reflector = Reflector(f"pods[{namespace}]", list_call(api, POD, namespace), self._listed, self._event,
                                   **reflector_opts)

    def start(self) -> None:
        self.reflector.start()

    async def stop(self) -> None:
        await self.reflector.stop()

    # ---- pools (their writers call these) -------------------------------------------------------------------
    def set_pool(self, spec: PoolSpec, decorate: Decorate | None = None) -> None:
        old = self.pools.get(spec.name)
        self.pools[spec.name] = (spec, decorate)
        if old is None or old[0] != spec or old[1] is not decorate:
            self.datastore.set_pool(spec, self._endpoints(spec, decorate))

    def remove_pool(self, name: str) -> None:
        if self.pools.pop(name, None) is not None:
            self.datastore.remove_pool(name)

    def _endpoints(self, spec: PoolSpec, decorate: Decorate | None) -> list[Endpoint]:
        out = []
        for pod in self.pods.values():
            if not matches((pod.get("metadata") or {}).get("labels") or {}, spec.selector):
                continue
            for ep in pod_endpoints(pod, spec.target_ports):
                got = decorate(ep) if decorate is not None else ep
                if got is not None:
                    out.append(got)
        return out

    # ---- pods ------------------------------------------------------------------------------------------------
    def _listed(self, items: list[dict[str, Any]]) -> None:
        self.pods = {obj_name(p): p for p in items}
        self._dirty = set(self.pools)
        self._flush()
        self.synced.set()

    def _event(self, etype: str, pod: dict[str, Any]) -> None:
        name = obj_name(pod)
        old = self.pods.get(name)
        if etype == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        for pool, (spec, _) in self.pools.items():
            for p in (old, pod):
                if p is not None and matches((p.get("metadata") or {}).get("labels") or {}, spec.selector):
                    self._dirty.add(pool)
        if self._dirty and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for name in sorted(dirty):
            got = self.pools.get(name)
            if got is not None and self.datastore.snapshot(name) is not None:
                self.datastore.set_endpoints(name, self._endpoints(*got))

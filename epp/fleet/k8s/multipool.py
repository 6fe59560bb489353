"""Many InferencePools in one Pointsman (`--epp-service-name`): every InferencePool of the namespace whose
`endpointPickerRef` (v1; `extensionRef` in v1alpha2) names Pointsman's own Service, plus `--pool-name` if given
(GIE compatibility; it stays the default pool). Each becomes a datastore pool of its own, fed by one namespace-wide
pod watch (epp.fleet.k8s.pods.PodPools); which pool a request is scheduled in is epp/request/pool_select.py's answer.

InferenceObjectives and InferenceModelRewrites apply when their poolRef names any served pool (the datastore keeps
one table of each, shared by the pools).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from epp.aio import wait_set
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.k8s.convert import (
    InvalidObject,
    obj_name,
    objective_priority,
    pool_spec,
    refers_to_pool,
    rewrite_rules,
)
from epp.fleet.k8s.discovery import list_call
from epp.fleet.k8s.pods import PodPools
from epp.fleet.k8s.reflector import Reflector, ReflectorOptions
from epp.fleet.k8s.resources import INFERENCE_MODEL_REWRITE, INFERENCE_OBJECTIVE, pool_resource

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


def picker_ref(obj: Mapping[str, Any]) -> str:
    """The Service an InferencePool sends its requests' endpoint picks to ("" when none)."""
    spec = obj.get("spec") or {}
    ref = spec.get("endpointPickerRef") or spec.get("extensionRef") or {}
    kind = ref.get("kind") or "Service"
    return str(ref.get("name") or "") if kind == "Service" else ""


class MultiPoolDiscovery:
    def __init__(self, datastore: Datastore, namespace: str, api: ApiClient, service: str, *, pool_name: str | None = None,
                 pool_group: str = "inference.networking.k8s.io", pods: PodPools | None = None,
                 **reflector_opts: Unpack[ReflectorOptions]) -> None:
        self.datastore = datastore
        self.namespace = namespace
        self.service = service
        self.pool_name = pool_name
        self.pool_group = pool_group
        self.own_pods = pods is None
        self.pods = pods or PodPools(datastore, api, namespace, **reflector_opts)
        if pool_name is None:
            datastore.auto_default = False  # peers: only --pool-name makes one of them the default
        self.served: dict[str, PoolSpec] = {}
        self.objects: dict[str, dict[str, Any]] = {}  # every InferencePool of the namespace, by name
        self.objectives: dict[str, dict[str, Any]] = {}
        self.rewrites: dict[str, dict[str, Any]] = {}
        self._parts: set[str] = set()
        self._synced = asyncio.Event()
        mk = functools.partial(list_call, api)
        self.reflectors = [
            Reflector(f"inferencepools[{namespace}]", mk(pool_resource(pool_group), namespace),
                      functools.partial(self._listed, self.objects, "pools"),
                      functools.partial(self._event, self.objects), **reflector_opts),
            Reflector(f"inferenceobjectives[{namespace}]", mk(INFERENCE_OBJECTIVE, namespace),
                      functools.partial(self._listed, self.objectives, "objectives"),
                      functools.partial(self._event, self.objectives), **reflector_opts),
            Reflector(f"inferencemodelrewrites[{namespace}]", mk(INFERENCE_MODEL_REWRITE, namespace),
                      functools.partial(self._listed, self.rewrites, "rewrites"),
                      functools.partial(self._event, self.rewrites), **reflector_opts),
        ]

    def start(self) -> None:
        if self.own_pods:
            self.pods.start()
        for r in self.reflectors:
            r.start()
        asyncio.get_running_loop().create_task(self._await_pods())

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.reflectors))
        if self.own_pods:
            await self.pods.stop()

    async def wait_synced(self, timeout: float | None = None) -> bool:
        return await wait_set(self._synced, timeout)

    async def _await_pods(self) -> None:
        await self.pods.synced.wait()
        self._part_done("pods")

    def _part_done(self, part: str) -> None:
        self._parts.add(part)
        if {"pools", "pods", "objectives", "rewrites"} <= self._parts and not self._synced.is_set():
            self.datastore.synced = True
            self._synced.set()
            log.info("kubernetes discovery synced: serving InferencePools %s", ", ".join(sorted(self.served)) or "-")

    # ---- caches ----------------------------------------------------------------------------------------------
    def _listed(self, cache: dict[str, Any], part: str, items: list[dict[str, Any]]) -> None:
        cache.clear()
        cache.update({obj_name(o): o for o in items})
        self._apply()
        self._part_done(part)

    def _event(self, cache: dict[str, Any], etype: str, obj: dict[str, Any]) -> None:
        if etype == "DELETED":
            cache.pop(obj_name(obj), None)
        else:
            cache[obj_name(obj)] = obj
        self._apply()

    def _mine(self, obj: Mapping[str, Any]) -> bool:
        return obj_name(obj) == self.pool_name or picker_ref(obj) == self.service

    def _apply(self) -> None:
        want: dict[str, PoolSpec] = {}
        for name, obj in self.objects.items():
            if not self._mine(obj):
                continue
            try:
                want[name] = pool_spec(obj)
            except InvalidObject as e:
                if name in self.served:
                    log.error("%s; keeping the previous pool definition", e)
                    want[name] = self.served[name]
                else:
                    log.error("%s; not serving it", e)
        for name in sorted(set(self.served) - set(want)):
            log.info("InferencePool %s/%s is no longer served here", self.namespace, name)
            self.pods.remove_pool(name)
        for name, spec in want.items():
            if self.served.get(name) != spec:
                log.info("serving InferencePool %s/%s", self.namespace, name)
            self.pods.set_pool(spec)
        self.served = want
        objectives: dict[str, int] = {}
        rules = []
        for obj in self.objectives.values():
            if any(refers_to_pool(obj, p, self.pool_group) for p in want):
                try:
                    objectives[obj_name(obj)] = objective_priority(obj)
                except InvalidObject as e:
                    log.error("%s; ignoring it", e)
        for obj in self.rewrites.values():
            if any(refers_to_pool(obj, p, self.pool_group) for p in want):
                try:
                    rules.extend(rewrite_rules(obj))
                except InvalidObject as e:
                    log.error("%s; ignoring the whole object", e)
        self.datastore.objectives = objectives
        self.datastore.rewrites = sorted(rules, key=lambda r: r.order())

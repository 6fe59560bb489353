"""Pool discovery (InferencePool mode) and selector discovery (standalone `--endpoint-selector` mode).

Both keep the datastore in step with the cluster and set `datastore.synced = True` only once every initial LIST
has been applied (pool + pods + objectives + rewrites, or just pods in selector mode). All datastore writes happen
on the event loop; pod bursts are coalesced into one `set_endpoints` per loop iteration.

    disc = await start_pool_discovery(ds, pool_name="llama", namespace="default")
    await disc.wait_synced(30)
    ...
    await disc.stop()
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from epp.aio import wait_set
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.k8s.convert import (
    InvalidObject,
    matches,
    obj_name,
    objective_priority,
    pod_endpoints,
    pool_spec,
    refers_to_pool,
    rewrite_rules,
    selector_string,
)
from epp.fleet.k8s.reflector import Reflector, ReflectorOptions
from epp.fleet.k8s.resources import (
    ENDPOINT_SLICE,
    INFERENCE_MODEL_REWRITE,
    INFERENCE_OBJECTIVE,
    INFERENCE_POOL,
    POD,
    ROUTE_RESOURCES,
    SECRET,
    WATCHED_RESOURCES,
    Resource,
    pool_resource,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


def make_api_client(host: str | None = None, kubeconfig: str | None = None) -> k8s.ApiClient:
    """An ApiClient: explicit host (proxies), else an explicit kubeconfig, else in-cluster config, else the default
    kubeconfig file."""
    if host:
        return k8s.ApiClient(k8s.Configuration(host=host))
    if kubeconfig:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        return k8s.ApiClient(cfg)
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=kubeconfig)
    return k8s.ApiClient()


def list_call(api: k8s.ApiClient, res: Resource, namespace: str, **selectors: Any) -> Any:
    if res not in WATCHED_RESOURCES and res not in ROUTE_RESOURCES:  # the RBAC in deploy/ grants exactly these
        raise ValueError(f"{res.plural} is not in epp.fleet.k8s.WATCHED_RESOURCES or ROUTE_RESOURCES; add it there (and "
                         "to the RBAC)")
    if res == POD:
        return functools.partial(k8s.CoreV1Api(api).list_namespaced_pod, namespace, **selectors)
    if res == SECRET:
        return functools.partial(k8s.CoreV1Api(api).list_namespaced_secret, namespace, **selectors)
    if res == ENDPOINT_SLICE:
        return functools.partial(k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice, namespace, **selectors)
    return functools.partial(
        k8s.CustomObjectsApi(api).list_namespaced_custom_object, res.group, res.version, namespace, res.plural,
        **selectors,
    )


class _Base:
    def __init__(self, datastore: Datastore, api: k8s.ApiClient, namespace: str, reflector_opts: ReflectorOptions):
        self.datastore = datastore
        self.api = api
        self.namespace = namespace
        self.opts = reflector_opts.copy()
        self.spec: PoolSpec | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.pod_reflector: Reflector | None = None
        self._parts: set[str] = set()
        self._needed: set[str] = set()
        self._flush_scheduled = False
        self._synced = asyncio.Event()

    # ---- pods --------------------------------------------------------------------------------------------
    async def _watch_pods(self, selector: Mapping[str, str]) -> None:
        if self.pod_reflector is not None:
            await self.pod_reflector.stop()
        self._parts.discard("pods")
        sel = selector_string(selector)
        self.pod_reflector = Reflector(
            f"pods[{self.namespace}/{sel}]",
            list_call(self.api, POD, self.namespace, label_selector=sel),
            self._pods_listed,
            self._pod_event,
            **self.opts,
        )
        self.pod_reflector.start()

    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        self.pods = {obj_name(p): p for p in items}
        self._flush_now()
        self._part_done("pods")

    def _pod_event(self, etype: str, pod: dict[str, Any]) -> None:
        if etype == "DELETED":
            self.pods.pop(obj_name(pod), None)
        else:
            self.pods[obj_name(pod)] = pod
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        spec = self.spec
        if spec is None or self.datastore.snapshot(spec.name) is None:
            return
        eps = []
        for pod in self.pods.values():
            if matches((pod.get("metadata") or {}).get("labels") or {}, spec.selector):
                eps.extend(pod_endpoints(pod, spec.target_ports))
        self.datastore.set_endpoints(spec.name, eps)

    # ---- sync --------------------------------------------------------------------------------------------
    def _part_done(self, part: str) -> None:
        self._parts.add(part)
        if self._needed <= self._parts and not self.datastore.synced:
            self.datastore.synced = True
            self._synced.set()
            log.info("kubernetes discovery synced (%s)", ", ".join(sorted(self._needed)))

    async def wait_synced(self, timeout: float | None = None) -> bool:
        return await wait_set(self._synced, timeout)

    def _reflectors(self) -> list[Reflector]:
        return [self.pod_reflector] if self.pod_reflector else []

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self._reflectors()))


class PoolDiscovery(_Base):
    """Watches one InferencePool by name, the pods its selector picks, and the objectives/rewrites for it."""

    def __init__(
        self,
        datastore: Datastore,
        pool_name: str,
        namespace: str,
        api: k8s.ApiClient,
        pool_group: str = INFERENCE_POOL.group,
        **reflector_opts: Unpack[ReflectorOptions],
    ) -> None:
        super().__init__(datastore, api, namespace, reflector_opts)
        self.pool_name = pool_name
        self.pool_group = pool_group
        pool_res = pool_resource(pool_group)
        self._needed = {"pool", "pods", "objectives", "rewrites"}
        self.objectives: dict[str, dict[str, Any]] = {}
        self.rewrites: dict[str, dict[str, Any]] = {}
        mk = functools.partial(list_call, api)
        self.pool_reflector = Reflector(
            f"inferencepool[{namespace}/{pool_name}]",
            mk(pool_res, namespace, field_selector=f"metadata.name={pool_name}"),
            self._pools_listed, self._pool_event, **reflector_opts,
        )
        self.objective_reflector = Reflector(
            f"inferenceobjectives[{namespace}]", mk(INFERENCE_OBJECTIVE, namespace),
            functools.partial(self._cache_listed, self.objectives, self._apply_objectives, "objectives"),
            functools.partial(self._cache_event, self.objectives, self._apply_objectives), **reflector_opts,
        )
        self.rewrite_reflector = Reflector(
            f"inferencemodelrewrites[{namespace}]", mk(INFERENCE_MODEL_REWRITE, namespace),
            functools.partial(self._cache_listed, self.rewrites, self._apply_rewrites, "rewrites"),
            functools.partial(self._cache_event, self.rewrites, self._apply_rewrites), **reflector_opts,
        )
        self._pool_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        for r in (self.pool_reflector, self.objective_reflector, self.rewrite_reflector):
            r.start()

    def _reflectors(self) -> list[Reflector]:
        return [self.pool_reflector, self.objective_reflector, self.rewrite_reflector, *super()._reflectors()]

    async def stop(self) -> None:
        if self._pool_task is not None and not self._pool_task.done():
            await self._pool_task  # let a pending pod-watch restart finish, then stop everything
        await super().stop()

    # ---- the pool ----------------------------------------------------------------------------------------
    def _pools_listed(self, items: list[dict[str, Any]]) -> None:
        mine = [p for p in items if obj_name(p) == self.pool_name]
        if mine:
            self._pool_upsert(mine[0])
        else:
            log.warning("InferencePool %s/%s not found; waiting for it", self.namespace, self.pool_name)
            self._pool_deleted()

    def _pool_event(self, etype: str, obj: dict[str, Any]) -> None:
        if obj_name(obj) != self.pool_name:
            return
        if etype == "DELETED":
            self._pool_deleted()
        else:
            self._pool_upsert(obj)

    def _pool_upsert(self, obj: dict[str, Any]) -> None:
        try:
            spec = pool_spec(obj)
        except InvalidObject as e:
            log.error("%s; keeping the previous pool definition", e)
            return
        old = self.spec
        self.spec = spec
        self.datastore.set_pool(spec)
        self._part_done("pool")
        if old is None or dict(old.selector) != dict(spec.selector):
            if old is not None:
                log.info("InferencePool %s: selector changed to %s", spec.name, selector_string(spec.selector))
            self._pool_task = asyncio.get_running_loop().create_task(self._watch_pods(spec.selector))
        self._flush_now()  # ports or selector may have changed: recompute from the pods we have

    def _pool_deleted(self) -> None:
        if self.spec is not None:
            log.warning("InferencePool %s/%s deleted; no endpoints until it comes back", self.namespace, self.pool_name)
        self.spec = None
        self.pods = {}
        self.datastore.remove_pool(self.pool_name)
        self._parts.discard("pool")
        self._parts.discard("pods")
        self.datastore.synced = False
        self._synced.clear()
        if self.pod_reflector is not None:
            r, self.pod_reflector = self.pod_reflector, None
            asyncio.get_running_loop().create_task(r.stop())

    # ---- objectives and rewrites -------------------------------------------------------------------------
    def _cache_listed(self, cache: dict[str, Any], apply: Callable[[], None], part: str, items: list[dict[str, Any]]) -> None:
        cache.clear()
        cache.update({obj_name(o): o for o in items})
        apply()
        self._part_done(part)

    def _cache_event(self, cache: dict[str, Any], apply: Callable[[], None], etype: str, obj: dict[str, Any]) -> None:
        if etype == "DELETED":
            cache.pop(obj_name(obj), None)
        else:
            cache[obj_name(obj)] = obj
        apply()

    def _apply_objectives(self) -> None:
        out: dict[str, int] = {}
        for name, obj in self.objectives.items():
            if not refers_to_pool(obj, self.pool_name, self.pool_group):
                continue
            try:
                out[name] = objective_priority(obj)
            except InvalidObject as e:
                log.error("%s; ignoring it", e)
        self.datastore.objectives = out

    def _apply_rewrites(self) -> None:
        rules = []
        for obj in self.rewrites.values():
            if not refers_to_pool(obj, self.pool_name, self.pool_group):
                continue
            try:
                rules.extend(rewrite_rules(obj))
            except InvalidObject as e:
                log.error("%s; ignoring the whole object", e)
        self.datastore.rewrites = sorted(rules, key=lambda r: r.order())


class SelectorDiscovery(_Base):
    """Standalone mode: pods in a namespace matched by a label selector, no InferencePool."""

    def __init__(
        self,
        datastore: Datastore,
        namespace: str,
        selector: Mapping[str, str],
        target_ports: tuple[int, ...],
        api: k8s.ApiClient,
        pool_name: str = "default",
        **reflector_opts: Unpack[ReflectorOptions],
    ) -> None:
        super().__init__(datastore, api, namespace, reflector_opts)
        self._needed = {"pods"}
        self.spec = PoolSpec(pool_name, namespace, dict(selector), tuple(target_ports))

    async def start(self) -> None:
        assert self.spec is not None
        self.datastore.set_pool(self.spec, [])
        await self._watch_pods(self.spec.selector)


async def start_pool_discovery(
    datastore: Datastore,
    pool_name: str,
    namespace: str,
    api: k8s.ApiClient | None = None,
    pool_group: str = INFERENCE_POOL.group,
    **reflector_opts: Unpack[ReflectorOptions],
) -> PoolDiscovery:
    """Start watching (returns at once; `await disc.wait_synced(t)` to wait for the initial lists).

    `pool_group` selects the InferencePool API: inference.networking.k8s.io (v1) or inference.networking.x-k8s.io
    (v1alpha2). reflector_opts: watch_timeout_s (300), backoff_initial_s (0.2), backoff_max_s (10),
    request_timeout_s (30).
    """
    disc = PoolDiscovery(datastore, pool_name, namespace, api or make_api_client(), pool_group, **reflector_opts)
    disc.start()
    return disc


async def start_selector_discovery(
    datastore: Datastore,
    namespace: str,
    selector: Mapping[str, str],
    target_ports: tuple[int, ...],
    pool_name: str = "default",
    api: k8s.ApiClient | None = None,
    **reflector_opts: Unpack[ReflectorOptions],
) -> SelectorDiscovery:
    """`--endpoint-selector k=v,... --endpoint-target-ports 8000,8001` (parse them with epp.fleet.k8s.convert
    parse_selector / parse_ports)."""
    disc = SelectorDiscovery(
        datastore, namespace, selector, target_ports, api or make_api_client(), pool_name, **reflector_opts
    )
    await disc.start()
    return disc

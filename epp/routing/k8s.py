"""Kubernetes watch of the routing documents (`--watch-routes`), with the real client.

- Kthena's ModelRoute, ModelServer and ExternalModelProvider, and LLMKube's ModelRouter, in the namespace, each
  listed and watched (a kind whose CRD is not installed lists as empty); every object is compiled on its own (a
  bad one keeps its last good version and never takes the others down);
- ModelServers and InferenceServices (ModelRouter backends) get their pods from one namespace-wide pod watch
  (epp.fleet.k8s.pods.PodPools);
- the Secrets that ExternalModelProviders and ModelRouter external backends name, one watch per Secret by name (field selector metadata.name), so
  Pointsman reads no Secret it was not pointed at. Secret values go to the credential store and nowhere else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from kubernetes.client.exceptions import ApiException

from epp.fleet.k8s import SECRET, PodPools, Reflector, Resource, list_call, obj_name
from epp.routing.dialects import DIALECTS
from epp.routing.documents import RawDocument

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from typing_extensions import Unpack

    from epp.routing.service import RoutingService

log = logging.getLogger(__name__)
KINDS: tuple[Resource, ...] = tuple(r for d in DIALECTS for r in d.resources)  # every dialect's documents


class ReflectorOptions(TypedDict, total=False):
    """The reflectors' timings (epp.fleet.k8s.Reflector's keyword arguments), passed through to every watch."""

    watch_timeout_s: int
    backoff_initial_s: float
    backoff_max_s: float
    request_timeout_s: float


def _tolerant(res: Resource, call: Callable[..., object], on_missing: Callable[[Resource], None]
              ) -> Callable[..., object]:
    """A list call that reports a kind whose CRD is not installed (HTTP 404) through `on_missing` (logged once), so a
    Kthena installation without the ModelRouter CRD, or an LLMKube one without Kthena's, still syncs; the reflector
    keeps retrying the list with back-off, so a CRD installed later is picked up."""
    warned = False

    def list_call(*args: object, **kwargs: object) -> object:
        nonlocal warned
        try:
            return call(*args, **kwargs)
        except ApiException as e:
            if e.status == 404 and not kwargs.get("watch"):
                if not warned:
                    warned = True
                    log.info("%s (%s) is not served by the API server (its CRD is not installed); none to route "
                             "by until it is", res.plural, res.api_version)
                on_missing(res)
            raise

    return list_call


def _doc(res: Resource, obj: Mapping[str, Any]) -> RawDocument:
    full = {"apiVersion": res.api_version, "kind": res.kind, **obj}  # list items may omit them
    return RawDocument(full, "kubernetes")


def _secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    out = {}
    for k, v in (obj.get("data") or {}).items():
        try:
            out[str(k)] = base64.b64decode(str(v), validate=True)
        except (binascii.Error, ValueError):
            log.error("Secret %s: key %s is not base64; ignoring it", obj_name(obj), k)
    for k, v in (obj.get("stringData") or {}).items():
        out[str(k)] = str(v).encode()
    return out


class RouteWatch:
    def __init__(self, service: RoutingService, api: ApiClient, namespace: str, *, pods: PodPools | None = None,
                 **reflector_opts: Unpack[ReflectorOptions]) -> None:
        self.service = service
        self.api = api
        self.namespace = namespace
        self.opts = reflector_opts
        self.own_pods = pods is None
        self.pods = pods or PodPools(service.datastore, api, namespace, **reflector_opts)
        self.reflectors = [
            Reflector(f"{res.plural}[{namespace}]", _tolerant(res, list_call(api, res, namespace), self._missing),
                      functools.partial(self._listed, res), functools.partial(self._event, res), **reflector_opts)
            for res in KINDS
        ]
        self.secrets: dict[str, Reflector] = {}
        self.synced = asyncio.Event()
        self._listed_kinds: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.service.set_pods(self.pods)
        if self.own_pods:
            self.pods.start()
        for r in self.reflectors:
            r.start()

    async def stop(self) -> None:
        rs = [*self.reflectors, *self.secrets.values()]
        await asyncio.gather(*(r.stop() for r in rs))
        if self.own_pods:
            await self.pods.stop()

    # ---- routing documents ---------------------------------------------------------------------------------
    def _source(self, res: Resource) -> str:
        return f"kubernetes:{self.namespace}/{res.plural}"

    def _listed(self, res: Resource, items: list[dict[str, Any]]) -> None:
        self.service.documents.replace(self._source(res), [_doc(res, o) for o in items])
        self._changed()
        self._kind_done(res)

    def _kind_done(self, res: Resource) -> None:
        self._listed_kinds.add(res.plural)
        if len(self._listed_kinds) == len(KINDS):
            self.synced.set()

    def _missing(self, res: Resource) -> None:
        """(a reflector thread) The kind's CRD is not installed: nothing of it to wait for."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._kind_done, res)

    def _event(self, res: Resource, etype: str, obj: dict[str, Any]) -> None:
        if etype == "DELETED":
            meta = obj.get("metadata") or {}
            self.service.documents.delete(self._source(res), (res.kind, str(meta.get("namespace") or "default"),
                                                              obj_name(obj)))
        else:
            self.service.documents.upsert(self._source(res), _doc(res, obj))
        self._changed()

    def _changed(self) -> None:
        self.service.refresh()
        self._sync_secrets()

    # ---- the Secrets providers name --------------------------------------------------------------------------
    def _sync_secrets(self) -> None:
        wanted = {p.auth.secret_name for p in self.service.router.table.providers.values()
                  if p.auth is not None and p.namespace == self.namespace}
        for name in sorted(set(self.secrets) - wanted):
            r = self.secrets.pop(name)
            asyncio.get_running_loop().create_task(r.stop())
            self.service.credentials.remove_secret(self.namespace, name)
        for name in sorted(wanted - set(self.secrets)):
            r = Reflector(f"secret[{self.namespace}/{name}]",
                          list_call(self.api, SECRET, self.namespace, field_selector=f"metadata.name={name}"),
                          functools.partial(self._secret_listed, name), functools.partial(self._secret_event, name),
                          **self.opts)
            self.secrets[name] = r
            r.start()

    def _secret_listed(self, name: str, items: list[dict[str, Any]]) -> None:
        mine = [o for o in items if obj_name(o) == name]
        if mine:
            self.service.credentials.set_secret(self.namespace, name, _secret_data(mine[0]))
        else:
            log.warning("Secret %s/%s (named by an ExternalModelProvider) does not exist yet", self.namespace, name)
            self.service.credentials.remove_secret(self.namespace, name)

    def _secret_event(self, name: str, etype: str, obj: dict[str, Any]) -> None:
        if obj_name(obj) != name:
            return
        if etype == "DELETED":
            self.service.credentials.remove_secret(self.namespace, name)
        else:
            self.service.credentials.set_secret(self.namespace, name, _secret_data(obj))

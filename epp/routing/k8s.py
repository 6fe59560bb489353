"""Kubernetes watch of Kthena's routing documents (`--watch-routes`), with the real client.

- ModelRoute, ModelServer and ExternalModelProvider in the namespace, each listed and watched; every object is
  compiled on its own (a bad one keeps its last good version and never takes the others down);
- ModelServers that select pods get their endpoints from one namespace-wide pod watch (epp.k8s.pods.PodPools);
- the Secrets that ExternalModelProviders name, one watch per Secret by name (field selector metadata.name), so
  Pointsman reads no Secret it was not pointed at. Secret values go to the credential store and nowhere else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
from collections.abc import Mapping
from typing import Any

from epp.k8s import EXTERNAL_MODEL_PROVIDER, MODEL_ROUTE, MODEL_SERVER, SECRET, Resource
from epp.k8s.convert import obj_name
from epp.k8s.discovery import _list_call
from epp.k8s.pods import PodPools
from epp.k8s.reflector import Reflector
from epp.routing.documents import RawDocument

log = logging.getLogger(__name__)
KINDS = (MODEL_ROUTE, MODEL_SERVER, EXTERNAL_MODEL_PROVIDER)


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
    def __init__(self, service: Any, api: Any, namespace: str, *, pods: PodPools | None = None,
                 **reflector_opts: Any) -> None:
        self.service = service
        self.api = api
        self.namespace = namespace
        self.opts = reflector_opts
        self.own_pods = pods is None
        self.pods = pods or PodPools(service.datastore, api, namespace, **reflector_opts)
        self.reflectors = [
            Reflector(f"{res.plural}[{namespace}]", _list_call(api, res, namespace),
                      functools.partial(self._listed, res), functools.partial(self._event, res), **reflector_opts)
            for res in KINDS
        ]
        self.secrets: dict[str, Reflector] = {}
        self.synced = asyncio.Event()
        self._listed_kinds: set[str] = set()

    def start(self) -> None:
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
        self._listed_kinds.add(res.plural)
        if len(self._listed_kinds) == len(KINDS):
            self.synced.set()

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
                          _list_call(self.api, SECRET, self.namespace, field_selector=f"metadata.name={name}"),
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

"""The EDS resources: one ClusterLoadAssignment per pool, built from the datastore (upb messages from xds-protos).

An endpoint out of rotation is kept in the assignment with a health status, never dropped, so Envoy's fallback
policies (and the override_host lookup, which ignores health) still see it:
- `UNHEALTHY`: the datastore holds it out of rotation (`Datastore.is_routable` is False: failed scrapes);
- `DEGRADED`: routable, but its metrics are stale (no good scrape within the staleness threshold);
- `UNKNOWN`: just discovered, not scraped yet (Envoy treats it as healthy);
- `HEALTHY`: otherwise.

`ResourceTable` caches each pool's assignment and rebuilds it only when what Envoy would see changes (addresses,
names, health), so the 50 ms metrics updates cost a cheap fingerprint comparison per pool, not a rebuild.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import address_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import any_pb2

from epp.fleet import Datastore, PoolSnapshot
from scheduling.types import Endpoint

EDS_TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
WILDCARD = "*"

HEALTHY: int = health_check_pb2.HEALTHY
UNKNOWN: int = health_check_pb2.UNKNOWN
UNHEALTHY: int = health_check_pb2.UNHEALTHY
DEGRADED: int = health_check_pb2.DEGRADED


def health_of(ep: Endpoint, datastore: Datastore) -> int:
    if not datastore.is_routable(ep.key):
        return UNHEALTHY
    if ep.metrics.updated_at is None:
        return UNKNOWN  # not scraped yet: Envoy load-balances UNKNOWN like HEALTHY
    if ep.metrics.stale:
        return DEGRADED
    return HEALTHY


def build_assignment(name: str, snap: PoolSnapshot | None, datastore: Datastore) -> endpoint_pb2.ClusterLoadAssignment:
    """The pool's endpoints in one locality, in key order; an unknown pool gives an empty assignment."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    if snap is None or not snap.endpoints:
        return cla
    locality = cla.endpoints.add()
    for ep in snap.endpoints:
        lb = locality.lb_endpoints.add()
        lb.endpoint.address.socket_address.CopyFrom(
            address_pb2.SocketAddress(address=ep.address.strip("[]"), port_value=ep.port))
        lb.endpoint.hostname = ep.name
        lb.health_status = health_of(ep, datastore)
    return cla


def _fingerprint(snap: PoolSnapshot | None, datastore: Datastore) -> tuple[Any, ...]:
    if snap is None:
        return ()
    return tuple((e.key, e.name, health_of(e, datastore)) for e in snap.endpoints)


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    packed: any_pb2.Any
    digest: bytes  # sha256 of the serialized assignment
    endpoints: int


def _pack(name: str, cla: endpoint_pb2.ClusterLoadAssignment) -> Resource:
    body = cla.SerializeToString(deterministic=True)
    packed = any_pb2.Any(type_url=EDS_TYPE_URL, value=body)
    count = sum(len(loc.lb_endpoints) for loc in cla.endpoints)
    return Resource(name, packed, hashlib.sha256(body).digest(), count)


class ResourceTable:
    """The current assignment of every pool the datastore knows, plus empty ones for names it does not."""

    def __init__(self, datastore: Datastore) -> None:
        self.datastore = datastore
        self._cache: dict[str, tuple[tuple[Any, ...], Resource]] = {}

    def refresh(self) -> set[str]:
        """Bring every pool's resource up to date; return the names whose content changed."""
        ds = self.datastore
        changed: set[str] = set()
        names = set(ds.pool_names())
        for gone in [n for n in self._cache if n not in names]:
            del self._cache[gone]
            changed.add(gone)
        for name in names:
            snap = ds.snapshot(name)
            fp = _fingerprint(snap, ds)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == fp:
                continue
            res = _pack(name, build_assignment(name, snap, ds))
            if cached is None or cached[1].digest != res.digest:
                changed.add(name)
            self._cache[name] = (fp, res)
        return changed

    @property
    def synced(self) -> bool:
        """True once the source has delivered its first full view: a pool missing then really is missing."""
        return bool(self.datastore.synced)

    def known(self) -> list[str]:
        return sorted(self._cache)

    def resolve(self, names: Iterable[str]) -> tuple[list[Resource], list[str]]:
        """The resources for subscribed names (`*` means every pool), and the names that are no pool.

        A name that is no pool gets an empty assignment once the datastore has synced (Envoy then stops waiting
        and knows the cluster has no endpoints); before that it is left out, and Envoy keeps waiting for it."""
        wanted = set(names)
        if WILDCARD in wanted:
            wanted = (wanted - {WILDCARD}) | set(self._cache)
        out: list[Resource] = []
        unknown: list[str] = []
        for name in sorted(wanted):
            cached = self._cache.get(name)
            if cached is not None:
                out.append(cached[1])
                continue
            unknown.append(name)
            if self.synced:
                out.append(_pack(name, endpoint_pb2.ClusterLoadAssignment(cluster_name=name)))
        return out, unknown


def version_of(resources: Iterable[Resource]) -> str:
    """A content version: equal content gives an equal version, across restarts and Pointsman replicas."""
    h = hashlib.sha256()
    for r in resources:
        h.update(r.name.encode())
        h.update(b"\0")
        h.update(r.digest)
    return h.hexdigest()[:16]


__all__ = [
    "DEGRADED",
    "EDS_TYPE_URL",
    "HEALTHY",
    "UNHEALTHY",
    "UNKNOWN",
    "WILDCARD",
    "Resource",
    "ResourceTable",
    "build_assignment",
    "health_of",
    "version_of",
]

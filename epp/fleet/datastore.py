"""The datastore: pools, their endpoints, the latest metrics, and the picker's own in-flight counts.

Writers (the static-file source, the Kubernetes watchers, the metrics scraper) replace whole endpoint snapshots.
Readers (the director) take an immutable `PoolSnapshot`; a snapshot never changes under a scheduling cycle.
Everything runs on one asyncio loop, so no locks are needed.

Endpoint lifecycle. The datastore is the one place that knows when an endpoint joins or leaves: after every write
it compares the endpoints of all pools with the previous ones, by key (`ip:port`) and identity (the pod's
namespace/name). An endpoint leaves when its key is in no pool any more, or when its key now belongs to another pod
(a new pod that reuses the address). On leaving, the datastore drops its own per-endpoint state (in-flight counts,
the unhealthy mark) and tells every `on_endpoint_removed` listener, which drop theirs (scheduler plugins, scraper,
event subscribers); `on_endpoint_added` listeners hear of each arrival. So an ip:port that comes back starts clean.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scheduling.api import NO_LOAD, InflightLoad
from scheduling.types import Endpoint, Metrics

_Arg = TypeVar("_Arg")  # what a datastore listener is called with

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    namespace: str = "default"
    selector: Mapping[str, str] = field(default_factory=dict)
    target_ports: tuple[int, ...] = ()
    app_protocol: str = "http"


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    spec: PoolSpec
    endpoints: tuple[Endpoint, ...]
    by_key: Mapping[str, Endpoint]
    by_ip: Mapping[str, tuple[Endpoint, ...]]


def _index(spec: PoolSpec, endpoints: Iterable[Endpoint]) -> PoolSnapshot:
    eps = tuple(sorted(endpoints, key=lambda e: e.key))
    by_ip: dict[str, list[Endpoint]] = {}
    for ep in eps:
        by_ip.setdefault(ep.address.strip("[]"), []).append(ep)
    return PoolSnapshot(spec, eps, {e.key: e for e in eps}, {k: tuple(v) for k, v in by_ip.items()})


@dataclass(frozen=True, slots=True)
class InflightTicket:
    """What `InflightTracker.add` hands out and `remove` takes back: one request on one endpoint generation."""

    key: str
    generation: int
    tokens: int


class InflightTracker:
    """Exact per-endpoint in-flight requests and tokens: +1 at the pick, −1 when the stream ends.

    Every run of non-zero load on a key gets a fresh generation number from one global counter, and a ticket
    carries it: `forget` (the endpoint left) drops the key's count at once, and the tickets handed out before are
    released without effect, so requests still running on a departed pod never weigh on a new pod that reuses its
    address, and no count goes negative. Only keys with load are kept: the tracker's size is bounded by the
    requests in flight, whatever the churn.

    Other replicas' loads (the replica bus) come in as ABSOLUTE snapshots per peer (`set_remote`), which replace
    that peer's previous one and disappear with `drop_remote` when it expires: `view()` is then the sum of the local
    counts and every live peer's, which is what the scheduler reads. `local_view()` is what this process publishes;
    `on_local_change` (the bus's notify) hears of every local change.
    """

    def __init__(self) -> None:
        self._loads: dict[str, InflightLoad] = {}
        self._generation: dict[str, int] = {}  # same keys as _loads
        self._next = 0
        self._remote: dict[str, dict[str, InflightLoad]] = {}  # peer -> its absolute loads
        self._merged: dict[str, InflightLoad] = {}  # local + remote, kept only while some peer has a snapshot
        self.on_local_change: Callable[[], None] | None = None

    def view(self) -> Mapping[str, InflightLoad]:
        return self._merged if self._remote else self._loads

    def local_view(self) -> Mapping[str, InflightLoad]:
        return self._loads

    def get(self, key: str) -> InflightLoad:
        return self.view().get(key, NO_LOAD)

    def add(self, key: str, tokens: int = 0) -> InflightTicket:
        cur = self._loads.get(key)
        if cur is None:
            self._next += 1
            self._generation[key] = self._next
            self._loads[key] = InflightLoad(1, tokens)
        else:
            self._loads[key] = InflightLoad(cur.requests + 1, cur.tokens + tokens)
        if self._remote:
            self._remerge(key)
        if self.on_local_change is not None:
            self.on_local_change()
        return InflightTicket(key, self._generation[key], tokens)

    def remove(self, ticket: InflightTicket) -> bool:
        """Release one request. False when its endpoint left since the request started (nothing to release)."""
        key = ticket.key
        if self._generation.get(key) != ticket.generation:
            return False  # the endpoint left (and maybe came back) since this request started
        cur = self._loads[key]
        if cur.requests == 1:
            del self._loads[key]
            del self._generation[key]
        else:
            self._loads[key] = InflightLoad(cur.requests - 1, max(0, cur.tokens - ticket.tokens))
        if self._remote:
            self._remerge(key)
        if self.on_local_change is not None:
            self.on_local_change()
        return True

    def forget(self, key: str) -> None:
        """The endpoint left: its count restarts at zero and outstanding tickets become no-ops."""
        self._loads.pop(key, None)
        self._generation.pop(key, None)
        for loads in self._remote.values():
            loads.pop(key, None)
        self._merged.pop(key, None)

    # ---- other replicas ----------------------------------------------------------------------------------
    def set_remote(self, peer: str, loads: Mapping[str, InflightLoad]) -> None:
        """Replace `peer`'s absolute snapshot (endpoints it has nothing in flight on are simply absent)."""
        if not self._remote:
            self._merged = dict(self._loads)
        old = self._remote.get(peer, {})
        self._remote[peer] = dict(loads)
        for key in old.keys() | loads.keys():
            self._remerge(key)

    def drop_remote(self, peer: str) -> None:
        """The peer's snapshot expired (or the peer left): its load no longer counts."""
        old = self._remote.pop(peer, None)
        if old is None:
            return
        if not self._remote:
            self._merged = {}
            return
        for key in old:
            self._remerge(key)

    def remote_peers(self) -> list[str]:
        return list(self._remote)

    def _remerge(self, key: str) -> None:
        requests = tokens = 0
        cur = self._loads.get(key)
        if cur is not None:
            requests, tokens = cur.requests, cur.tokens
        for loads in self._remote.values():
            r = loads.get(key)
            if r is not None:
                requests += r.requests
                tokens += r.tokens
        if requests or tokens:
            self._merged[key] = InflightLoad(requests, tokens)
        else:
            self._merged.pop(key, None)


class Datastore:
    """Pools by name. The first pool set becomes the default unless `default_pool` names another."""

    def __init__(self, default_pool: str | None = None) -> None:
        self._pools: dict[str, PoolSnapshot] = {}
        self._default = default_pool
        # The first pool set becomes the default (one pool, or an endpoints file's first); a watcher serving several
        # peer pools (epp.fleet.k8s.multipool) turns this off, so a request's pool is never an accident of listing order.
        self.auto_default = True
        self.inflight = InflightTracker()
        self.adapters: dict[str, str] = {}  # LoRA adapter -> base model
        self.objectives: dict[str, int] = {}  # InferenceObjective name -> priority
        self.rewrites: list[Any] = []  # InferenceModelRewrite rules (epp.fleet.rewrites.RewriteRule)
        self._listeners: list[Callable[[str], None]] = []
        self._added: list[Callable[[Endpoint], None]] = []
        self._removed: list[Callable[[str], None]] = []
        self._members: dict[str, tuple[str, str]] = {}  # endpoint key -> identity (namespace, pod name)
        self.synced = False  # set by the source once the first full view is in
        # Endpoint keys the scraper took out of rotation after a failure streak; the director skips them.
        self.unhealthy: set[str] = set()
        # Endpoint keys passive health (epp.fleet.passive) holds out of rotation: failed responses, or a probe in
        # flight. Its only writer is the passive-health tracker; the director skips them too.
        self.ejected: set[str] = set()
        self._metrics_listeners: list[Callable[[Iterable[str]], None]] = []

    # ---- writers -------------------------------------------------------------------------------------------
    def set_pool(self, spec: PoolSpec, endpoints: Iterable[Endpoint] | None = None) -> None:
        """Create or replace a pool. With endpoints None, keep the current endpoints (a spec change)."""
        if endpoints is None:
            old = self._pools.get(spec.name)
            endpoints = old.endpoints if old else ()
        self._pools[spec.name] = _index(spec, self._carry_metrics(spec.name, endpoints))
        if self._default is None and self.auto_default:
            self._default = spec.name
        self._notify(spec.name)

    def remove_pool(self, name: str) -> None:
        if self._pools.pop(name, None) is not None:
            self._notify(name)

    def set_endpoints(self, pool: str, endpoints: Iterable[Endpoint]) -> None:
        snap = self._pools.get(pool)
        if snap is None:
            raise KeyError(f"unknown pool {pool!r}")
        self._pools[pool] = _index(snap.spec, self._carry_metrics(pool, endpoints))
        self._notify(pool)

    def update_metrics(self, updates: Mapping[str, Metrics]) -> None:
        """Replace the metrics of the endpoints named by key, in every pool; one snapshot rebuild per pool."""
        for name, snap in list(self._pools.items()):
            if not any(k in snap.by_key for k in updates):
                continue
            eps = [e.with_metrics(updates[e.key]) if e.key in updates else e for e in snap.endpoints]
            self._pools[name] = _index(snap.spec, eps)
        for fn in self._metrics_listeners:
            try:
                fn(updates.keys())
            except Exception:  # a listener must never break a writer
                log.exception("datastore metrics listener failed")

    def on_metrics_updated(self, fn: Callable[[Iterable[str]], None]) -> None:
        """`fn(keys)` after every metrics batch, with the keys of the endpoints it updated."""
        self._metrics_listeners.append(fn)

    def _carry_metrics(self, pool: str, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """A re-listed endpoint keeps the metrics it had: discovery must not reset what scraping learnt."""
        old = self._pools.get(pool)
        out = []
        for ep in endpoints:
            prev = old.by_key.get(ep.key) if old else None
            if prev is not None and ep.metrics.updated_at is None and prev.metrics.updated_at is not None:
                ep = ep.with_metrics(prev.metrics)
            out.append(ep)
        return out

    def on_change(self, fn: Callable[[str], None]) -> None:
        """`fn(pool name)` after every change of a pool's spec or endpoint set."""
        self._listeners.append(fn)

    def on_endpoint_added(self, fn: Callable[[Endpoint], None]) -> None:
        """`fn(endpoint)` when an endpoint joins (its key was in no pool, or belonged to another pod)."""
        self._added.append(fn)

    def on_endpoint_removed(self, fn: Callable[[str], None]) -> None:
        """`fn(key)` when an endpoint leaves every pool (or its key now belongs to another pod): drop its state."""
        self._removed.append(fn)

    def _notify(self, pool: str) -> None:
        self._update_members()
        for fn in self._listeners:
            try:
                fn(pool)
            except Exception:  # a listener must never break a writer
                log.exception("datastore listener failed")

    def _update_members(self) -> None:
        members: dict[str, tuple[str, str]] = {}
        arrived: dict[str, Endpoint] = {}
        old = self._members
        for snap in self._pools.values():
            for ep in snap.endpoints:
                if ep.key in members:
                    continue
                ident = (ep.namespace, ep.name)
                members[ep.key] = ident
                if old.get(ep.key) != ident:
                    arrived[ep.key] = ep
        left = [k for k, ident in old.items() if members.get(k) != ident]
        self._members = members
        for key in left:
            self.inflight.forget(key)
            self.unhealthy.discard(key)
            self.ejected.discard(key)
            self._call(self._removed, key)
        for ep in arrived.values():
            self._call(self._added, ep)

    @staticmethod
    def _call(fns: list[Callable[[_Arg], None]], arg: _Arg) -> None:
        for fn in fns:
            try:
                fn(arg)
            except Exception:  # a listener must never break a writer
                log.exception("datastore endpoint listener failed")

    # ---- readers -------------------------------------------------------------------------------------------
    @property
    def default_pool(self) -> str | None:
        return self._default

    def pool_names(self) -> list[str]:
        return sorted(self._pools)

    def snapshot(self, pool: str | None = None) -> PoolSnapshot | None:
        name = pool or self._default
        return self._pools.get(name) if name else None

    def all_endpoints(self) -> list[Endpoint]:
        seen: dict[str, Endpoint] = {}
        for snap in self._pools.values():
            for ep in snap.endpoints:
                seen.setdefault(ep.key, ep)
        return list(seen.values())

    def endpoint(self, key: str) -> Endpoint | None:
        """The endpoint with this key in the first pool that has it (as `all_endpoints` would list it)."""
        for snap in self._pools.values():
            ep = snap.by_key.get(key)
            if ep is not None:
                return ep
        return None

    def members(self) -> Mapping[str, tuple[str, str]]:
        """Every endpoint key in some pool, with its identity (namespace, pod name)."""
        return self._members

    def is_routable(self, key: str) -> bool:
        """False while the scraper (consecutive scrape failures) or passive health holds the endpoint out."""
        return key not in self.unhealthy and key not in self.ejected

    def in_rotation(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints not held out by the scraper or passive health; all of them when every one is out (that
        is more likely a problem with the evidence than a dead pool)."""
        eps: list[Endpoint] = list(endpoints)
        unhealthy, ejected = self.unhealthy, self.ejected
        if unhealthy or ejected:
            healthy = [e for e in eps if e.key not in unhealthy and e.key not in ejected]
            eps = healthy or eps
        return eps

    def routable(self, pool: str | None) -> list[Endpoint]:
        """The pool's endpoints in rotation (see `in_rotation`); [] for an unknown pool."""
        snap = self.snapshot(pool)
        return [] if snap is None else self.in_rotation(snap.endpoints)

    def set_unhealthy(self, key: str, unhealthy: bool) -> None:
        if unhealthy:
            if key in self._members:  # a departed endpoint is never marked
                self.unhealthy.add(key)
        else:
            self.unhealthy.discard(key)

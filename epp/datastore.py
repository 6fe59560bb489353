"""The datastore: pools, their endpoints, the latest metrics, and the picker's own in-flight counts.

Writers (the static-file source, the Kubernetes watchers, the metrics scraper) replace whole endpoint snapshots.
Readers (the director) take an immutable `PoolSnapshot`; a snapshot never changes under a scheduling cycle.
Everything runs on one asyncio loop, so no locks are needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.api import InflightLoad
from scheduling.types import Endpoint, Metrics

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


class InflightTracker:
    """Exact per-endpoint in-flight requests and tokens: +1 at the pick, −1 when the stream ends."""

    def __init__(self) -> None:
        self._loads: dict[str, InflightLoad] = {}
        self.total = 0

    def view(self) -> Mapping[str, InflightLoad]:
        return self._loads

    def get(self, key: str) -> InflightLoad:
        return self._loads.get(key, InflightLoad())

    def add(self, key: str, tokens: int = 0) -> None:
        cur = self._loads.get(key)
        if cur is None:
            self._loads[key] = InflightLoad(1, tokens)
        else:
            self._loads[key] = InflightLoad(cur.requests + 1, cur.tokens + tokens)
        self.total += 1

    def remove(self, key: str, tokens: int = 0) -> None:
        cur = self._loads.get(key)
        if cur is None or cur.requests <= 0:
            log.error("in-flight count for %s would go negative; ignoring", key)
            return
        if cur.requests == 1:
            del self._loads[key]
        else:
            self._loads[key] = InflightLoad(cur.requests - 1, max(0, cur.tokens - tokens))
        self.total -= 1


class Datastore:
    """Pools by name. The first pool set becomes the default unless `default_pool` names another."""

    def __init__(self, default_pool: str | None = None) -> None:
        self._pools: dict[str, PoolSnapshot] = {}
        self._default = default_pool
        self.inflight = InflightTracker()
        self.adapters: dict[str, str] = {}  # LoRA adapter -> base model
        self.objectives: dict[str, int] = {}  # InferenceObjective name -> priority
        self.rewrites: list[Any] = []  # InferenceModelRewrite rules (epp.rewrite.RewriteRule)
        self._listeners: list[Callable[[str], None]] = []
        self.synced = False  # set by the source once the first full view is in
        # Endpoint keys the scraper took out of rotation after a failure streak; the director skips them.
        self.unhealthy: set[str] = set()

    # ---- writers -------------------------------------------------------------------------------------------
    def set_pool(self, spec: PoolSpec, endpoints: Iterable[Endpoint] | None = None) -> None:
        """Create or replace a pool. With endpoints None, keep the current endpoints (a spec change)."""
        if endpoints is None:
            old = self._pools.get(spec.name)
            endpoints = old.endpoints if old else ()
        self._pools[spec.name] = _index(spec, self._carry_metrics(spec.name, endpoints))
        if self._default is None:
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
        self._listeners.append(fn)

    def _notify(self, pool: str) -> None:
        for fn in self._listeners:
            try:
                fn(pool)
            except Exception:  # a listener must never break a writer
                log.exception("datastore listener failed")

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

    def is_routable(self, key: str) -> bool:
        """False while the scraper holds the endpoint out of rotation (consecutive scrape failures)."""
        return key not in self.unhealthy

    def set_unhealthy(self, key: str, unhealthy: bool) -> None:
        if unhealthy:
            self.unhealthy.add(key)
        else:
            self.unhealthy.discard(key)

    def base_model(self, model: str) -> str:
        return self.adapters.get(model, model)

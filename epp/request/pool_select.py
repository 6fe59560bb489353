"""Which pool a request is scheduled in, when one Pointsman serves several.

In order (the first that answers wins):
1. a route decision (epp/routing): its backend's pool;
2. the pool Envoy names: dynamic metadata `pointsman.pool` (plain Envoy: a per-route `set_metadata` filter config,
   forwarded with `metadata_options.forwarding_namespaces`; explain's `pool` field);
3. only one pool (not counting route backends): that one;
4. the subset hint (`envoy.lb.subset_hint`): the one pool that holds every hinted address;
5. the request's model: the one pool with an endpoint that lists the model among its served models (label
   `llm-d.ai/model` or annotation `llm-d.ai/models`); among several, the default pool if it is one of them;
6. the default pool (`--pool-name`).
Nothing answers: a 503 that names the pools, so the operator can tell Envoy which one (step 2).
"""

from __future__ import annotations

from collections.abc import Collection

from epp.fleet import Datastore


def _ip(entry: str) -> str:
    if entry.startswith("["):
        return entry[1:entry.find("]")]
    return entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry


def choose_pool(
    datastore: Datastore,
    *,
    default: str | None,
    hint: list[str] | None = None,
    model: str = "",
    exclude: Collection[str] = (),
) -> str | None:
    """Steps 3-6 above, over the pools not in `exclude` (route backends)."""
    names = [n for n in datastore.pool_names() if n not in exclude]
    if default in exclude:
        default = None
    if len(names) <= 1:
        return default or (names[0] if names else None)
    if hint:
        ips = {_ip(h) for h in hint}
        holding = []
        for n in names:
            snap = datastore.snapshot(n)
            if snap is not None and ips <= set(snap.by_ip):
                holding.append(n)
        if len(holding) == 1:
            return holding[0]
    if model:
        serving = []
        for n in names:
            snap = datastore.snapshot(n)
            if snap is not None and any(model in e.models for e in snap.endpoints):
                serving.append(n)
        if len(serving) == 1:
            return serving[0]
        if default in serving:
            return default
    return default

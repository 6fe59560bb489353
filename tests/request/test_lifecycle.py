"""Endpoint lifecycle: the datastore reports departures, every plugin forgets, and churn cannot grow any state."""

from __future__ import annotations

import random
import tracemalloc

import orjson

from epp.fleet.datastore import Datastore, PoolSpec
from epp.request.director import Director
from scheduling.config import load_scheduler
from scheduling.prefix import APPROX_PREFIX
from scheduling.types import Endpoint, endpoint_key

# Every plugin that keeps per-endpoint state, and the prefix producer they share (small per-endpoint capacity, so
# the live endpoints' share of the index reaches its steady state within the test).
CONFIG = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "prefix-cache-scorer", "parameters": {"lruCapacityPerServer": 256, "autoTuneCapacity": False}},
        {"type": "estimated-latency-scorer"},
        {"type": "no-hit-lru-scorer"},
        {"type": "session-affinity-scorer"},
        {"type": "queue-scorer"},
    ],
}
HDRS = {":path": "/v1/chat/completions", ":method": "POST"}


def ep(ip: str, name: str) -> Endpoint:
    return Endpoint(endpoint_key(ip, 8000), ip, 8000, name=name, namespace="ns")


def body(text: str) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": text}]})


def producer_of(sched):
    return next(p for p in sched.plugins() if p.kind == "producer" and p.data_key().name == APPROX_PREFIX)


def setup():
    ds = Datastore()
    sched = load_scheduler(CONFIG, rng=random.Random(1))
    director = Director(ds, sched)
    current = [director]  # the app's current director: a reload replaces it whole
    ds.on_endpoint_removed(lambda key: current[0].scheduler.endpoint_removed(key))
    base = [ep(f"10.0.0.{i}", f"base-{i}") for i in range(1, 4)]
    ds.set_pool(PoolSpec("pool"), base)
    CURRENT[ds] = current
    return ds, sched, director, base


CURRENT: dict[Datastore, list[Director]] = {}


def route(director, text: str, session: str | None = None):
    ex = director.exchange()
    headers = dict(HDRS, **({"x-session-id": session} if session else {}))
    out = ex.decide(headers, body(text), {})
    assert not out.reject_status, out.reject_body
    return ex, dict(out.set_headers)["x-gateway-destination-endpoint"]


def test_churn_keeps_every_plugins_state_bounded():
    ds, sched, director, base = setup()
    producer = producer_of(sched)
    rng = random.Random(5)
    outstanding = []
    tracemalloc.start()
    snapshots = {}
    for cycle in range(10_000):
        newcomer = ep(f"10.{1 + cycle // 60_000}.{cycle // 250 % 240}.{cycle % 250}", f"pod-{cycle}")
        ds.set_endpoints("pool", [*base, newcomer])
        # Traffic: a long prompt (many blocks) per cycle, a session, some requests left in flight across removal.
        for j in range(2):
            ex, _ = route(director, f"cycle {cycle} request {j} " + "x" * rng.randint(100, 1500),
                          session=f"s{cycle % 50}")
            if rng.random() < 0.3:
                outstanding.append(ex)
            else:
                ex.close()
        ds.set_endpoints("pool", base)
        members = set(ds.members())
        assert sched.tracked_endpoints() <= members
        assert set(ds.inflight.view()) <= members
        if len(outstanding) > 20:
            for ex in outstanding:
                ex.close()
            outstanding.clear()
        if cycle in (999, 2_999):
            snapshots[cycle] = tracemalloc.take_snapshot()
            if cycle == 2_999:
                tracemalloc.stop()  # tracing is slow; the structure bounds above hold for every cycle
    for ex in outstanding:
        ex.close()
    assert ds.inflight.view() == {}
    # The prefix index holds blocks of the live endpoints only, and no more slots than endpoints ever at once.
    index = producer.index
    assert set(index.endpoints()) <= {e.key for e in base}
    assert len(index) <= sum(index.size(e.key) for e in base) <= 3 * 256
    assert sched.tracked_endpoints() <= {e.key for e in base}
    assert ds.unhealthy == set() and set(ds.members()) == {e.key for e in base}
    # Memory: 2,000 more cycles of churn leave the process's allocations where they were (within 64 KiB).
    growth = sum(s.size_diff for s in snapshots[2_999].compare_to(snapshots[999], "filename"))
    assert growth < 64 * 1024, f"memory grew by {growth} bytes over 2,000 churn cycles"


def test_a_new_pod_on_an_old_address_starts_clean():
    ds, sched, director, base = setup()
    producer = producer_of(sched)
    text = "shared system prompt " * 40
    ex, first = route(director, text, session="alice")
    ex.close()
    assert producer.index.size(first) > 0 and first in sched.tracked_endpoints()
    old = next(e for e in base if e.key == first)
    # Same ip:port, another pod, in one update: the old pod left and a new one joined.
    replaced = [e if e.key != first else ep(old.address, "replacement") for e in base]
    removed: list[str] = []
    added: list[str] = []
    ds.on_endpoint_removed(removed.append)
    ds.on_endpoint_added(lambda e: added.append(e.key))
    ds.set_endpoints("pool", replaced)
    assert removed == [first] and added == [first]
    assert producer.index.size(first) == 0 and first not in sched.tracked_endpoints()
    # Re-listing the same pods again is not churn.
    ds.set_endpoints("pool", list(replaced))
    assert removed == [first]


def test_inflight_of_a_departed_pod_never_weighs_on_its_successor():
    ds, sched, director, base = setup()
    ex, key = route(director, "hello")
    assert ds.inflight.get(key).requests == 1
    ds.set_endpoints("pool", [e for e in base if e.key != key])
    assert ds.inflight.get(key).requests == 0
    back = next(e for e in base if e.key == key)
    ds.set_endpoints("pool", base)  # the address comes back (a new pod)
    ex2 = director.exchange()
    ex2.decide({**HDRS, "test-epp-endpoint-selection": key}, body("x"), {})
    ex.close()  # the old request ends late: it must not release the new pod's count
    assert ds.inflight.view().get(back.key) is None or ds.inflight.get(back.key).requests <= 1
    ex2.close()
    assert ds.inflight.view() == {}


def test_removal_reaches_the_scheduler_after_a_reload():
    ds, sched, director, base = setup()
    ex, key = route(director, "before reload " * 30)
    ex.close()
    newer = load_scheduler(CONFIG, rng=random.Random(2))
    CURRENT[ds][0] = director = director.replace(scheduler=newer)
    ex, key2 = route(director, "after reload " * 30)
    ex.close()
    assert key2 in newer.tracked_endpoints()
    ds.set_endpoints("pool", [e for e in base if e.key != key2])
    assert key2 not in newer.tracked_endpoints()

"""Class-aware dispatch through the shell's request path with the built-in default scheduler (sloHold on): a loose
request whose pick is busy (tight work waiting for its first token, or half of maxNumSeqs in flight) is held, and
goes when the pick is no longer busy, at its deadline, or never (its client left); requests without headers and
tight ones are never held (docs/latency-model.md, epp/flowcontrol/hold.py)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import orjson
from prometheus_client import CollectorRegistry

from epp.api.slo_metrics import SloMetrics
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.saturation import ConcurrencyDetector
from epp.flowcontrol import FlowController, PoolPressure, SloHolds
from epp.protocol import Outcome
from epp.request.director import DESTINATION, Director
from epp.request.exchange import RequestExchange
from epp.request.holding import why as why_held
from scheduling.api import FlowControl
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, Metrics, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}
TIGHT = {**HDRS, "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}
LOOSE = {**HDRS, "x-slo-ttft-ms": "20000"}  # an 8 s budget: only a release or a cancel ends its hold here
KEY = "10.0.0.1:8000"


class Clock:
    """The holds' clock, frozen unless a test moves it: a tight request stays pending until its first token."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def rig(clock: Callable[[], float] | None = None) -> tuple[Director, SloHolds, CollectorRegistry]:
    ds = Datastore()
    ep = Endpoint(endpoint_key("10.0.0.1", 8000), "10.0.0.1", 8000, metrics=Metrics(stale=False, updated_at=0.0))
    ds.set_pool(PoolSpec("pool"), [ep])
    registry = CollectorRegistry()
    slo = SloMetrics(registry)
    holds = SloHolds(lambda key: ds.inflight.get(key).requests, slo, clock=clock or Clock())
    d = Director(ds, load_scheduler(None, rng=random.Random(0)), observers=[slo, holds], holds=holds)
    return d, holds, registry


def body(n: int = 1) -> bytes:
    return orjson.dumps({"model": "llama", "max_tokens": 8, "messages": [{"role": "user", "content": f"q{n}" * 50}]})


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def routed(out: object) -> str:
    assert isinstance(out, Outcome) and out.reject_status == 0, out
    return dict(out.set_headers)[DESTINATION]


def first_chunk(ex: RequestExchange) -> None:
    ex.response_headers({":status": "200", "content-type": "text/event-stream"}, {})
    ex.response_body(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', False)


async def test_a_loose_request_waits_for_the_tight_work_on_its_pick_and_goes_at_its_first_token():
    d, holds, registry = rig()
    tight = d.exchange()
    assert routed(tight.decide(TIGHT, body(1), {})) == KEY
    plain = d.exchange()  # no headers: never held, whatever is pending
    assert routed(plain.decide(HDRS, body(2), {})) == KEY
    loose = d.exchange()
    waiting = loose.decide(LOOSE, body(3), {})
    assert isinstance(waiting, asyncio.Future) and not waiting.done()
    assert holds.count == 1
    assert d.datastore.inflight.get(KEY).requests == 2  # held: not in flight, not committed
    assert sample(registry, "pointsman_slo_held_requests") == 1
    dry = RequestExchange(d, dry_run=True)  # explain: would be held (and why), holds nothing
    assert isinstance(dry.decide(LOOSE, body(4), {}), Outcome) and holds.count == 1
    assert why_held(dry).startswith(f"held as loose: {KEY} is busy")

    first_chunk(tight)  # the tight request's first token: the loose one goes, scheduled afresh
    assert waiting.done() and routed(waiting.result()) == KEY
    assert holds.count == 0 and dict(holds.outcomes) == {"released": 1}
    assert d.datastore.inflight.get(KEY).requests == 3
    assert sample(registry, "pointsman_slo_held_seconds_count", outcome="released") == 1
    assert sample(registry, "pointsman_slo_placed_total", **{"class": "loose"}) == 1  # counted once, when sent
    for ex in (tight, plain, loose):
        ex.close()
    assert d.datastore.inflight.view() == {} and holds.tight.pending == {}


async def test_a_client_that_leaves_while_held_leaves_at_once_and_a_tight_request_is_never_held():
    d, holds, registry = rig()
    tight = d.exchange()
    routed(tight.decide(TIGHT, body(1), {}))
    loose = d.exchange()
    waiting = loose.decide(LOOSE, body(2), {})
    assert isinstance(waiting, asyncio.Future)
    waiting.cancel()  # the client went away (the transport cancels the pending decision)
    await asyncio.sleep(0)
    assert holds.count == 0 and dict(holds.outcomes) == {"cancelled": 1}
    assert sample(registry, "pointsman_slo_held_seconds_count", outcome="cancelled") == 1
    tight2 = d.exchange()  # another tight request on the busy endpoint goes at once
    routed(tight2.decide(TIGHT, body(3), {}))
    tight.close()  # a tight request that ends without a first token is no longer pending
    assert len(holds.tight.pending[KEY]) == 1
    tight2.close()
    loose.close()
    assert holds.tight.pending == {} and d.datastore.inflight.view() == {}
    assert dict(holds.outcomes) == {"cancelled": 1}


async def test_a_full_endpoint_holds_a_loose_request_until_a_request_there_ends():
    """sloHoldShare 0.5 x maxNumSeqs 16: with 8 requests in flight a loose one waits for the 9th slot."""
    d, holds, _ = rig()
    tight = d.exchange()
    routed(tight.decide(TIGHT, body(0), {}))
    first_chunk(tight)  # no tight work pending any more
    plain = [d.exchange() for _ in range(7)]
    for i, ex in enumerate(plain):
        routed(ex.decide(HDRS, body(10 + i), {}))
    loose = d.exchange()
    waiting = loose.decide(LOOSE, body(2), {})
    assert isinstance(waiting, asyncio.Future) and holds.count == 1
    plain[0].close()  # one ends: the held request goes
    assert waiting.done() and routed(waiting.result()) == KEY and dict(holds.outcomes) == {"released": 1}
    for ex in (tight, loose, *plain):
        ex.close()
    assert d.datastore.inflight.view() == {}


async def test_a_held_request_goes_at_its_deadline_and_holding_nothing_creates_nothing():
    d, holds, registry = rig(time.monotonic)  # the real clock: the deadline passes
    tight = d.exchange()
    routed(tight.decide(TIGHT, body(1), {}))
    first_chunk(tight)
    plain = [d.exchange() for _ in range(7)]  # 8 in flight: busy, with no tight work to wait for
    for i, ex in enumerate(plain):
        routed(ex.decide(HDRS, body(10 + i), {}))
    loose = d.exchange()
    # (500 ms x 0.8 headroom - about 45 ms predicted) x sloHoldSlack 0.5: held for at most ~0.18 s
    waiting = loose.decide({**HDRS, "x-slo-ttft-ms": "500"}, body(2), {})
    assert isinstance(waiting, asyncio.Future)
    assert routed(await asyncio.wait_for(waiting, 10)) == KEY
    assert dict(holds.outcomes) == {"deadline": 1} and holds.count == 0
    assert sample(registry, "pointsman_slo_held_seconds_count", outcome="deadline") == 1
    for ex in plain:
        ex.close()
    again = d.exchange()  # nothing busy: a loose request goes synchronously (no future, no timer)
    assert routed(again.decide(LOOSE, body(3), {})) == KEY and why_held(again) == ""
    for ex in (tight, loose, again):
        ex.close()
    assert dict(holds.outcomes) == {"deadline": 1}


async def test_without_its_first_token_tight_work_counts_until_its_predicted_ttft():
    """With lean response phases Pointsman never sees the first token: the tight request's predicted TTFT (about
    45 ms here) ends its pending, and the request held for it goes then."""
    clock = Clock()
    d, holds, _ = rig(clock)
    tight = d.exchange()
    routed(tight.decide(TIGHT, body(1), {}))
    loose = d.exchange()
    waiting = loose.decide(LOOSE, body(2), {})
    assert isinstance(waiting, asyncio.Future)
    await asyncio.sleep(0.2)  # (the holds' own clock has not moved: still pending)
    assert not waiting.done()
    clock.t += 1.0  # its predicted TTFT has passed
    assert routed(await asyncio.wait_for(waiting, 10)) == KEY
    assert dict(holds.outcomes) == {"released": 1} and holds.tight.pending == {}
    for ex in (tight, loose):
        ex.close()


async def test_a_client_that_left_just_before_the_release_is_counted_once_and_shutdown_sends_the_held():
    d, holds, _ = rig()
    tight = d.exchange()
    routed(tight.decide(TIGHT, body(1), {}))
    gone, kept = d.exchange(), d.exchange()
    leaving, waiting = gone.decide(LOOSE, body(2), {}), kept.decide(LOOSE, body(3), {})
    assert isinstance(leaving, asyncio.Future) and isinstance(waiting, asyncio.Future) and holds.count == 2
    leaving.cancel()  # its callback has not run when the release comes: it is not sent, and counted once
    holds.close()  # shutdown: the one still waiting goes now
    assert holds.count == 0 and dict(holds.outcomes) == {"cancelled": 1, "shutdown": 1}
    assert waiting.done() and routed(waiting.result()) == KEY
    await asyncio.sleep(0)  # (the cancelled one's callback runs: nothing more is counted)
    assert dict(holds.outcomes) == {"cancelled": 1, "shutdown": 1}
    assert d.datastore.inflight.get(KEY).requests == 2  # the tight one and the one sent at shutdown
    for ex in (tight, gone, kept):
        ex.close()
    assert d.datastore.inflight.view() == {}


async def test_a_request_that_waited_in_flow_controls_queue_is_not_held_again():
    """Flow control (two slots) queues a loose request while the pool is full; when a slot frees it goes, though
    its pick still has tight work pending: it has waited already."""
    d, holds, _ = rig()
    detector = ConcurrencyDetector(d.datastore.inflight, max_concurrency=2)
    flow = FlowController(FlowControl(), PoolPressure(d.datastore, d.datastore.routable, detector))
    d = d.replace(flow=flow)
    tight, plain = d.exchange(), d.exchange()
    routed(tight.decide(TIGHT, body(1), {}))
    routed(plain.decide(HDRS, body(2), {}))
    loose = d.exchange()
    queued = loose.decide(LOOSE, body(3), {})
    assert isinstance(queued, asyncio.Future) and flow.queued() == 1 and holds.count == 0
    plain.close()  # a slot frees: its turn comes, and it is routed though the tight request is still pending
    assert routed(await asyncio.wait_for(queued, 10)) == KEY
    assert holds.count == 0 and not holds.outcomes and holds.tight.pending
    for ex in (tight, loose):
        ex.close()
    await flow.close()

"""The replica bus over a real nats-server (Debian's, started by the tests): the mesh's semantics on one subject per
pool (absolute loads with expiry, records, the replay to a replica that joins), and the drills: the broker killed
and restarted on its port, one replica cut from the broker (a TCP proxy the test controls), a slow consumer. In
every drill routing goes on, what was lost comes back from the next snapshots, and nothing is left over: a
silent replica's load expires and in-flight counts return to zero."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.bus import ReplicaBus, encode
from epp.bus.codec import BusMessage
from epp.bus.nats_transport import NatsTransport
from epp.fleet.datastore import InflightTracker
from epp.natsconn import NatsTarget, connect
from tests.support.nats_server import NatsServer, TcpProxy
from tests.support.wait import until

KEY = "10.0.0.1:8000"
SUBJECT = "pointsman.bus.test.pool"
TTL, HEARTBEAT = 0.6, 0.05


@pytest.fixture
def server():
    srv = NatsServer().start()
    yield srv
    srv.stop()


def nats_bus(name: str, url: str, *, secret: bytes | None = None, subject: str = SUBJECT,
             **transport: int) -> ReplicaBus:
    t = NatsTransport(NatsTarget.parse(url), subject, name=name, signed=secret is not None, **transport)
    return ReplicaBus(name, InflightTracker(), ttl=TTL, heartbeat=HEARTBEAT, secret=secret, transport=t)


class Records:
    """A record channel: what this bus produced (outbox), its recent ones (snapshot) and what it got from peers."""

    def __init__(self, bus: ReplicaBus) -> None:
        self.outbox: list = []
        self.recent: list = []
        self.got: dict[str, list] = {}
        bus.add_channel("prefix", self.take, self.sink, snapshot=lambda: list(self.recent))

    def take(self) -> list:
        out, self.outbox = self.outbox, []
        self.recent += out
        return out

    def sink(self, peer: str, items: list) -> None:
        self.got.setdefault(peer, []).extend(x for x in items if x not in self.got.get(peer, []))


async def started(*buses: ReplicaBus) -> tuple[ReplicaBus, ...]:
    for b in buses:
        await b.start()
    await until(lambda: all(len(b.live_peers()) == len(buses) - 1 for b in buses), 3.0, "every bus hears the others")
    return buses


async def stopped(*buses: ReplicaBus) -> None:
    for b in buses:
        await b.stop()


def requests(bus: ReplicaBus) -> int:
    return bus.inflight.get(KEY).requests


async def test_three_replicas_share_load_and_records_on_one_subject(server):
    a, b, c = await started(*(nats_bus(n, server.url, secret=b"k") for n in ("a:1", "b:1", "c:1")))
    try:
        ra, rb, rc = Records(a), Records(b), Records(c)
        t1, t2 = a.inflight.add(KEY, 100), b.inflight.add(KEY, 10)
        a.notify(), b.notify()
        await until(lambda: requests(c) == 2 and requests(a) == 2 and requests(b) == 2, 2.0, "every view has 2")
        assert c.inflight.get(KEY).tokens == 110 and c.inflight.local_view() == {}
        ra.outbox.append([KEY, [1, 2, 3]])
        a.notify()
        await until(lambda: rb.got.get("a:1") and rc.got.get("a:1"), 2.0, "a's record at b and c")
        assert rb.got["a:1"] == [[KEY, [1, 2, 3]]] and rc.got["a:1"] == [[KEY, [1, 2, 3]]]
        a.inflight.remove(t1), b.inflight.remove(t2)
        a.notify(), b.notify()
        await until(lambda: requests(c) == 0 and requests(a) == 0 and requests(b) == 0, 2.0, "releases everywhere")
        assert sorted(c.peers) == ["a:1", "b:1"]  # open membership: the peers are whoever publishes
        assert a.received["load"] > 0 and a.dropped == {}  # signed, on the subject: nothing dropped
    finally:
        await stopped(a, b, c)
    assert ra.got == {} or "a:1" not in ra.got  # no echo: a never hears itself


async def test_other_pools_and_unsigned_senders_are_not_heard(server):
    a, b = await started(nats_bus("a:1", server.url, secret=b"k"), nats_bus("b:1", server.url, secret=b"k"))
    other = nats_bus("x:1", server.url, secret=b"k", subject="pointsman.bus.test.other")
    rogue = nats_bus("r:1", server.url, secret=b"wrong")
    await other.start()
    await rogue.start()
    try:
        other.inflight.add(KEY)
        rogue.inflight.add(KEY)
        other.notify(), rogue.notify()
        await until(lambda: a.dropped["auth"] >= 3, 2.0, "the rogue's messages dropped")
        assert requests(a) == 0 and sorted(a.peers) == ["b:1"]
    finally:
        await stopped(a, b, other, rogue)


@pytest.mark.realtime
async def test_a_replica_that_joins_has_load_and_recent_records_within_one_second(server):
    a, b = await started(nats_bus("a:1", server.url), nats_bus("b:1", server.url))
    c = nats_bus("c:1", server.url)
    try:
        ra, rb = Records(a), Records(b)
        for i in range(50):
            ra.outbox.append([KEY, [i]])
            rb.outbox.append([KEY, [1000 + i]])
        a.inflight.add(KEY), b.inflight.add(KEY), b.inflight.add(KEY)
        a.notify(), b.notify()
        await until(lambda: requests(a) == 3 and requests(b) == 3, 2.0, "a and b busy")
        rc = Records(c)
        t0 = time.monotonic()
        await c.start()
        await until(lambda: requests(c) == 3 and len(rc.got.get("a:1", [])) == 50
                    and len(rc.got.get("b:1", [])) == 50, 1.0, lambda: f"c caught up: {requests(c)} {rc.got.keys()}")
        assert time.monotonic() - t0 < 1.0
    finally:
        await stopped(a, b, c)


async def test_broker_restart_loses_nothing_that_stays(server):
    a, b = await started(nats_bus("a:1", server.url), nats_bus("b:1", server.url))
    try:
        ra, rb = Records(a), Records(b)
        held = a.inflight.add(KEY)
        a.notify()
        await until(lambda: requests(b) == 1, 2.0, "b sees a's request")
        server.kill()
        # routing goes on: local changes are taken at once, the bus drops what it cannot send and counts it
        t = time.monotonic()
        for _ in range(100):
            a.inflight.remove(a.inflight.add(KEY))
        assert time.monotonic() - t < 0.5
        await until(lambda: requests(b) == 0 and b.live_peers() == [], 2.0, "a's load expires at b: no phantom")
        await until(lambda: a.dropped["disconnected"] > 0, 2.0, "sends dropped while the broker is down")
        assert not a.transport.connected
        ra.outbox.append([KEY, [7]])  # produced during the outage: replayed once the broker is back
        a.notify()
        server.restart()
        await until(lambda: requests(b) == 1 and b.live_peers() == ["a:1"], 5.0, "a's load rebuilt at b")
        await until(lambda: [KEY, [7]] in rb.got.get("a:1", []), 2.0, "a's records replayed after the restart")
        assert a.transport.connected and a.transport.reconnects >= 1
        a.inflight.remove(held)
        a.notify()
        await until(lambda: requests(b) == 0 and requests(a) == 0, 2.0, "counters back to zero")
        assert b.inflight.view() == {} and a.inflight.view() == {}
    finally:
        await stopped(a, b)


async def test_a_partition_between_one_replica_and_the_broker_heals(server):
    proxy = await TcpProxy(server.port).start()
    a, b = await started(nats_bus("a:1", proxy.url), nats_bus("b:1", server.url))
    try:
        ra, rb = Records(a), Records(b)
        held_a, held_b = a.inflight.add(KEY), b.inflight.add(KEY)
        a.notify(), b.notify()
        await until(lambda: requests(a) == 2 and requests(b) == 2, 2.0, "both see both")
        proxy.cut()
        # each side routes on its own view once the other's snapshot expires
        await until(lambda: requests(a) == 1 and requests(b) == 1, 2.0, "each side alone")
        assert a.inflight.remote_peers() == [] and b.inflight.remote_peers() == []
        ra.outbox.append([KEY, ["during"]])
        rb.outbox.append([KEY, ["during-b"]])
        a.notify(), b.notify()
        await asyncio.sleep(0.2)
        proxy.heal()
        await until(lambda: requests(a) == 2 and requests(b) == 2, 5.0, "views rebuilt after the partition")
        await until(lambda: [KEY, ["during"]] in rb.got.get("a:1", []) and [KEY, ["during-b"]] in ra.got.get("b:1", []),
                    2.0, "records of the partition replayed both ways")
        a.inflight.remove(held_a), b.inflight.remove(held_b)
        a.notify(), b.notify()
        await until(lambda: a.inflight.view() == {} and b.inflight.view() == {}, 2.0, "counters back to zero")
    finally:
        await stopped(a, b)
        await proxy.stop()


async def test_a_slow_consumer_drops_and_counts_then_catches_up(server):
    b = nats_bus("b:1", server.url, pending_msgs=16)
    await b.start()
    nc = await connect(NatsTarget.parse(server.url), name="burst")
    try:
        await until(lambda: b.transport.connected, 2.0, "b connected")
        # a burst of 2,000 load messages from "x:1" in one write: b's client queue (16) overflows
        for seq in range(1, 2001):
            body = {"ttl": TTL, "inflight": {KEY: [seq % 5 + 1, 0]}, "state": {}}
            await nc.publish(SUBJECT, encode(BusMessage("x:1", 1, seq, "load", body))[0])
        await nc.flush()
        await until(lambda: b.dropped["slow-consumer"] > 0, 2.0, "drops counted")
        # the next snapshot carries the truth, whatever was dropped
        await nc.publish(SUBJECT, encode(BusMessage("x:1", 1, 5000, "load",
                                                    {"ttl": TTL, "inflight": {KEY: [3, 0]}}))[0])
        await until(lambda: requests(b) == 3, 2.0, "the next snapshot applied")
        await until(lambda: requests(b) == 0 and b.peers == [], 2.0, "the silent sender expires: nothing left")
    finally:
        await nc.close()
        await b.stop()


async def test_routing_never_waits_for_a_hung_broker(server):
    a, b = await started(nats_bus("a:1", server.url), nats_bus("b:1", server.url))
    server.pause()  # connections open, nothing answered
    try:
        Records(a).outbox.extend([KEY, [i]] for i in range(20000))
        a.notify()
        t = time.monotonic()
        for _ in range(1000):
            a.inflight.remove(a.inflight.add(KEY))
            a.notify()
            await asyncio.sleep(0)
        assert time.monotonic() - t < 2.0
        await until(lambda: requests(b) == 0 and b.live_peers() == [], 2.0, "nothing left over at b")
    finally:
        server.resume()
        await stopped(a, b)

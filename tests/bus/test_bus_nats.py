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
from epp.stack.ports import free_port
from tests.bus.test_bus_replication import PREFIX_CONFIG, Replica
from tests.support.extproc_requests import chat, open_request, route
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
        await until(lambda: requests(a) == 3 and requests(b) == 3 and len(rb.got.get("a:1", [])) == 50, 2.0,
                    "a and b busy")
        heard = a.received["records"], b.received["records"]
        rc = Records(c)
        t0 = time.monotonic()
        await c.start()
        await until(lambda: requests(c) == 3 and len(rc.got.get("a:1", [])) == 50
                    and len(rc.got.get("b:1", [])) == 50, 1.0, lambda: f"c caught up: {requests(c)} {rc.got.keys()}")
        assert time.monotonic() - t0 < 1.0
        # each replay went to c's inbox alone: a and b heard no records from each other again
        assert (a.received["records"], b.received["records"]) == heard and a.replays == b.replays == 1
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
        server.restart()
        await until(lambda: requests(b) == 1 and b.live_peers() == ["a:1"], 5.0, "a's load rebuilt at b")
        assert a.transport.connected and a.transport.reconnects >= 1
        ra.outbox.append([KEY, [7]])  # records flow again
        a.notify()
        await until(lambda: [KEY, [7]] in rb.got.get("a:1", []), 2.0, "a's records reach b again")
        assert a.replays == b.replays == 0  # no replay per reconnect (no storm after a broker restart)
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
        ra.outbox.append([KEY, ["during"]])  # made during the partition: lost (counted), not replayed
        a.notify()
        await until(lambda: a.dropped["disconnected"] > 0, 2.0, "a's sends dropped and counted")
        proxy.heal()
        await until(lambda: requests(a) == 2 and requests(b) == 2, 5.0, "views rebuilt after the partition")
        ra.outbox.append([KEY, ["after"]])
        rb.outbox.append([KEY, ["after-b"]])
        a.notify(), b.notify()
        await until(lambda: [KEY, ["after"]] in rb.got.get("a:1", []) and [KEY, ["after-b"]] in ra.got.get("b:1", []),
                    2.0, "records flow both ways again")
        assert [KEY, ["during"]] not in rb.got.get("a:1", [])
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
        # the next snapshots (one per heartbeat, as a replica sends them) carry the truth, whatever was dropped
        seq = iter(range(5000, 6000))

        async def heartbeat() -> bool:
            await nc.publish(SUBJECT, encode(BusMessage("x:1", 1, next(seq), "load",
                                                        {"ttl": TTL, "inflight": {KEY: [3, 0]}}))[0])
            await asyncio.sleep(HEARTBEAT)
            return requests(b) == 3

        await until(heartbeat, 3.0, "the next snapshot applied")
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


# ---- real `epp serve` Apps over NATS ---------------------------------------------------------------------------

def app_replica(tmp_path, name: str, fleet: list[int], url: str, *extra: str) -> Replica:
    return Replica(tmp_path, name, fleet, free_port(), [], "--bus-url", url, "--config-text", PREFIX_CONFIG, *extra)


@pytest.mark.realtime
async def test_a_replica_started_next_to_busy_ones_over_nats_converges_within_one_second(tmp_path, fleet, server):
    a = await app_replica(tmp_path, "a", fleet, server.url).start()
    b = await app_replica(tmp_path, "b", fleet, server.url).start()
    c = app_replica(tmp_path, "c", fleet, server.url)
    try:
        await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "a and b hear each other")
        prompts = [f"shared prefix {i} " * 150 for i in range(6)]
        picked = [await route((a, b)[i % 2].stub, chat(p)) for i, p in enumerate(prompts)]
        held = [await open_request((a, b)[i % 2].stub, chat(f"long running {i}")) for i in range(4)]
        load = {k: v.requests for k, v in a.inflight.local_view().items()}
        for k, v in b.inflight.local_view().items():
            load[k] = load.get(k, 0) + v.requests
        await c.start()
        up = time.monotonic()
        await until(lambda: {k: v.requests for k, v in c.inflight.view().items()} == load, 1.0, "c sees a's and b's load")
        prefix_c = c.plugin("approx-prefix-cache-producer")
        prefix_a = a.plugin("approx-prefix-cache-producer")
        await until(lambda: all(prefix_c.index.size(k) == prefix_a.index.size(k) for k in set(picked)), 1.0,
                    "a's and b's recent prefixes at c")
        assert time.monotonic() - up < 1.0
        assert [await route(c.stub, chat(p + " follow-up")) for p in prompts] == picked
        for r in held:
            await r.finish()
        await until(lambda: c.inflight.view() == {}, 1.0, "releases reach c")
        metrics = await c.metrics()
        assert "pointsman_bus_connected 1.0" in metrics and "pointsman_bus_live_peers 2.0" in metrics
    finally:
        for r in (c, b, a):
            await r.stop()


async def test_replicas_keep_routing_through_a_broker_restart(tmp_path, fleet, server):
    a = await app_replica(tmp_path, "a", fleet, server.url).start()
    b = await app_replica(tmp_path, "b", fleet, server.url).start()
    try:
        await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "connected")
        held = [await open_request(a.stub, chat(f"held {i}")) for i in range(2)]
        await until(lambda: sum(v.requests for v in b.inflight.view().values()) == 2, 1.0, "b sees a's load")
        server.kill()
        assert [await route(b.stub, chat(f"during {i}")) for i in range(5)]  # routing goes on without NATS
        await until(lambda: b.inflight.view() == {}, 2.0, "a's load expires at b")
        server.restart()
        await until(lambda: sum(v.requests for v in b.inflight.view().values()) == 2, 5.0, "rebuilt at b")
        for r in held:
            await r.finish()
        await until(lambda: a.inflight.view() == {} and b.inflight.view() == {}, 2.0, "counters back to zero")
        assert "disconnected" in await a.metrics()
    finally:
        await a.stop()
        await b.stop()


async def test_credentials_in_the_url_log_in_and_never_reach_the_logs(caplog):
    srv = NatsServer("--user", "alice", "--pass", "s3cret").start()
    try:
        url = f"nats://alice:s3cret@127.0.0.1:{srv.port}"
        with caplog.at_level("INFO"):
            a, b = await started(nats_bus("a:1", url), nats_bus("b:1", url))
        a.inflight.add(KEY)
        a.notify()
        await until(lambda: requests(b) == 1, 2.0, "shared through an authenticated server")
        await stopped(a, b)
        assert "s3cret" not in caplog.text and "alice" in caplog.text
        with pytest.raises(Exception):  # noqa: B017 - nats-py's error for a refused login
            await connect(NatsTarget.parse(f"nats://alice:wrong@127.0.0.1:{srv.port}"), name="t",
                          allow_reconnect=False, max_reconnect_attempts=0)
    finally:
        srv.stop()


async def test_records_are_split_to_fit_the_servers_max_payload(tmp_path):
    conf = tmp_path / "nats.conf"
    conf.write_text("max_payload: 65536\n")
    srv = NatsServer("-c", str(conf)).start()
    try:
        a, b = await started(nats_bus("a:1", srv.url), nats_bus("b:1", srv.url))
        ra, rb = Records(a), Records(b)
        assert a.transport.max_message == 65536
        ra.outbox.extend([KEY, list(range(i, i + 128))] for i in range(600))  # ~0.7 MB of records in one turn
        a.notify()
        await until(lambda: len(rb.got.get("a:1", [])) == 600, 3.0, lambda: f"{len(rb.got.get('a:1', []))} of 600")
        assert a.dropped == {} and b.dropped == {}
        ra.outbox.append([KEY, list(range(40000))])  # one record larger than the server takes: dropped, counted
        a.notify()
        await until(lambda: a.dropped["too-large"] == 1, 2.0, "the oversized record counted")
        await stopped(a, b)
    finally:
        srv.stop()

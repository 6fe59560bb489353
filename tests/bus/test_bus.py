"""The replica bus over real ZMQ sockets: absolute loads with expiry, records, restarts and hostile messages."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq
import zmq.asyncio

from epp.bus import BusMessage, ReplicaBus, encode
from epp.bus.codec import MAGIC, BusMessageError, decode
from epp.fleet.datastore import InflightTracker
from epp.stack.ports import free_port
from tests.support.wait import until

KEY = "10.0.0.1:8000"


def addr() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
async def pair():
    a_addr, b_addr = addr(), addr()
    a = ReplicaBus(a_addr, InflightTracker(), peers=[b_addr], ttl=0.5, heartbeat=0.05)
    b = ReplicaBus(b_addr, InflightTracker(), peers=[a_addr], ttl=0.5, heartbeat=0.05)
    await a.start()
    await b.start()
    yield a, b
    await a.stop()
    await b.stop()


async def test_loads_are_shared_as_absolute_snapshots(pair):
    a, b = pair
    t1 = a.inflight.add(KEY, 100)
    t2 = a.inflight.add(KEY, 50)
    b.inflight.add(KEY, 7)
    a.notify()
    await until(lambda: b.inflight.get(KEY).requests == 3, 3.0, "b sees a's two requests plus its own")
    assert b.inflight.get(KEY).tokens == 157
    assert b.inflight.local_view()[KEY].requests == 1  # what b publishes is only its own
    a.inflight.remove(t1)
    a.inflight.remove(t2)
    a.notify()
    await until(lambda: b.inflight.get(KEY).requests == 1, 3.0, "a's releases reach b")
    await until(lambda: a.inflight.get(KEY).requests == 1, 3.0, "b's request reaches a")


async def test_a_vanished_peer_leaves_no_phantom_load(pair):
    a, b = pair
    a.inflight.add(KEY)
    a.notify()
    await until(lambda: b.inflight.get(KEY).requests == 1, 3.0, "load shared")
    await a.stop()  # a dies with a request in flight
    await until(lambda: b.inflight.get(KEY).requests == 0, 2.0, "expiry after ttl")
    assert b.inflight.view() == {} and b.inflight.remote_peers() == []


async def test_records_channel_and_state(pair):
    a, b = pair
    outbox: list = []
    got: list = []
    a.add_channel("prefix", lambda: [outbox.pop() for _ in range(len(outbox))], lambda p, items: None)
    b.add_channel("prefix", lambda: [], lambda peer, items: got.append((peer, items)))
    backlog: dict = {}
    a.add_state("backlog", lambda: {KEY: 1234.0}, lambda p, v: None)
    b.add_state("backlog", lambda: {}, lambda peer, values: backlog.__setitem__(peer, values))
    await until(lambda: a.live_peers() == [b.address], 3.0, "connected")  # records sent before are lost
    outbox.append([KEY, [1, 2, 3]])
    a.notify()
    await until(lambda: got, 3.0, "records delivered")
    assert got[0] == (a.address, [[KEY, [1, 2, 3]]])
    await until(lambda: backlog.get(a.address) == {KEY: 1234.0}, 3.0, "absolute state delivered")


async def test_restart_resets_what_the_old_incarnation_shared():
    a_addr, b_addr = addr(), addr()
    b = ReplicaBus(b_addr, InflightTracker(), peers=[a_addr], ttl=5.0, heartbeat=0.05)
    await b.start()
    a = ReplicaBus(a_addr, InflightTracker(), peers=[b_addr], ttl=5.0, heartbeat=0.05)
    await a.start()
    try:
        a.inflight.add(KEY)
        a.notify()
        await until(lambda: b.inflight.get(KEY).requests == 1, 3.0, "first life")
        await a.stop()
        a = ReplicaBus(a_addr, InflightTracker(), peers=[b_addr], ttl=5.0, heartbeat=0.05)  # restarted, idle
        await a.start()
        # ttl is 5 s: only the new incarnation (not expiry) can clear the old load this fast
        await until(lambda: b.inflight.get(KEY).requests == 0, 2.0, "new incarnation")
    finally:
        await a.stop()
        await b.stop()


async def test_hostile_messages_are_dropped_and_counted():
    rogue_addr, b_addr = addr(), addr()
    b = ReplicaBus(b_addr, InflightTracker(), peers=[rogue_addr], ttl=1.0, heartbeat=0.05, secret=None)
    await b.start()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{rogue_addr.rsplit(':', 1)[1]}")
    try:
        good = encode(BusMessage(rogue_addr, 7, 1, "load", {"ttl": 1.0, "inflight": {KEY: [2, 0]}}))
        hostile = [
            [b"\xff\x00garbage"],
            [msgpack.packb(["other/1", rogue_addr, 1, 1, "load", {}])],
            [msgpack.packb([MAGIC, rogue_addr, 1, 1, "load", {"ttl": 1.0, "inflight": {KEY: [-5, 0]}}])],
            [msgpack.packb([MAGIC, rogue_addr, 1, 1, "load", {"ttl": 1e9, "inflight": {}}])],
            [msgpack.packb([MAGIC, rogue_addr, 1, 1, "gossip", {}])],
            encode(BusMessage("10.9.9.9:1", 1, 1, "load", {"ttl": 1.0, "inflight": {KEY: [99, 0]}})),
        ]
        deadline = asyncio.get_running_loop().time() + 3
        while b.inflight.get(KEY).requests != 2:  # PUB/SUB slow joiner: resend until b hears it
            for frames in hostile:
                await pub.send_multipart(frames)
            good = encode(BusMessage(rogue_addr, 7, b.received["load"] + sum(b.dropped.values()) + 100, "load",
                                     {"ttl": 1.0, "inflight": {KEY: [2, 0]}}))
            await pub.send_multipart(good)
            await asyncio.sleep(0.05)
            assert asyncio.get_running_loop().time() < deadline, (b.dropped, b.received)
        assert b.inflight.get(KEY).requests == 2  # the hostile ones never counted (99 or negative)
        assert b.dropped["malformed"] >= 5 and b.dropped["unknown-peer"] >= 1
        stale = encode(BusMessage(rogue_addr, 7, 1, "load", {"ttl": 1.0, "inflight": {KEY: [50, 0]}}))
        with pytest.raises(BusMessageError, match="stale"):
            b.accept(stale)
        assert b.inflight.get(KEY).requests == 2
    finally:
        pub.close(0)
        ctx.term()
        await b.stop()


def test_hmac_secret():
    msg = BusMessage("x:1", 1, 1, "records", {"name": "n", "items": []})
    frames = encode(msg, b"s3cret")
    assert decode(frames, b"s3cret") == msg
    for bad in ([frames[0]], [frames[0], b"0" * 32]):
        with pytest.raises(BusMessageError) as err:
            decode(bad, b"s3cret")
        assert err.value.reason == "auth"


async def test_peer_set_changes_follow_discovery(pair):
    a, b = pair
    a.inflight.add(KEY)
    a.notify()
    await until(lambda: b.inflight.get(KEY).requests == 1, 3.0, "shared")
    b.set_peers([])  # a left the peer set (e.g. the headless Service dropped it)
    assert b.inflight.get(KEY).requests == 0 and b.peers == []


async def test_a_peer_back_after_its_ttl_lapsed_gets_its_load_back_and_no_replay_storm():
    now = [100.0]
    a_addr, b_addr = addr(), addr()
    b = ReplicaBus(b_addr, InflightTracker(), peers=[a_addr], ttl=1.0, heartbeat=0.05, clock=lambda: now[0])
    b.add_channel("prefix", lambda: [], lambda peer, items: None, snapshot=lambda: [[KEY, [1]]])
    await b.start()
    seq = iter(range(1, 100))

    def hear_a() -> None:
        b.accept(encode(BusMessage(a_addr, 7, next(seq), "load", {"ttl": 1.0, "inflight": {KEY: [1, 0]}})))

    try:
        hear_a()  # a joins: replayed one heartbeat later
        now[0] += 0.1
        await until(lambda: b.replays == 1, 2.0, "the join's replay")
        for _ in range(3):  # a stalls past its ttl and comes back, again and again (same incarnation)
            now[0] += 1.5
            await until(lambda: b.inflight.get(KEY).requests == 0 and b.live_peers() == [], 2.0, "a expired")
            hear_a()
            assert b.inflight.get(KEY).requests == 1 and b.live_peers() == [a_addr]  # its next snapshot counts
            now[0] += 0.1
            await asyncio.sleep(0.2)
        assert b.replays == 1  # only a join (a new incarnation) is replayed to
    finally:
        await b.stop()


async def test_only_loads_must_arrive_in_order():
    a_addr, b_addr = addr(), addr()
    got: list = []
    b = ReplicaBus(b_addr, InflightTracker(), peers=[a_addr])
    b.add_channel("prefix", lambda: [], lambda peer, items: got.extend(items))
    await b.start()
    b.accept(encode(BusMessage(a_addr, 7, 5, "load", {"ttl": 1.0, "inflight": {KEY: [2, 0]}})))
    b.accept(encode(BusMessage(a_addr, 7, 3, "records", {"name": "prefix", "items": [[KEY, [1]]]})))  # a replay
    assert got == [[KEY, [1]]]
    with pytest.raises(BusMessageError, match="stale"):
        b.accept(encode(BusMessage(a_addr, 7, 4, "load", {"ttl": 1.0, "inflight": {KEY: [9, 0]}})))
    assert b.inflight.get(KEY).requests == 2
    await b.stop()

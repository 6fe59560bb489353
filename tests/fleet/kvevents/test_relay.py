"""KV events through NATS JetStream (issue 31): `epp kv-relay` beside each modelsim engine, a real nats-server, and
replicas reading the pool's stream. The reference is a replica subscribed to the engines' ZMQ sockets directly:
the index built from the stream must be the same, for a replica that started late too, and after a broker
restart, a slow consumer, an engine restart, a cache reset or a batch nobody can supply."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq

from epp.fleet.datastore import Datastore
from epp.fleet.kvevents.jetstream import JetStreamKVSubscriber
from epp.fleet.kvevents.natswire import stream_name, subject
from epp.fleet.kvevents.relay import KVRelay
from epp.fleet.kvevents.service import PreciseService
from epp.fleet.kvevents.settings import RelaySettings
from epp.fleet.kvevents.sources import KVEventsSource
from epp.fleet.kvevents.subscriber import KVEventSubscriber
from epp.natsconn import NatsTarget, connect
from epp.stack.ports import free_port
from modelsim.kvevents import KVEventPublisher
from scheduling.prefix.precise import LIVE, UNKNOWN, PreciseIndex
from scheduling.types import Endpoint
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"
POOL = "llama"
ROOT = Path(__file__).resolve().parents[3]


def key(fleet: Any, i: int) -> str:
    return f"127.0.0.1:{fleet.config.base_port + i}"


def engine(fleet: Any, i: int) -> tuple[str, str | None]:
    cfg = fleet.config
    replay = f"tcp://127.0.0.1:{cfg.kv_events_replay_port + i}" if cfg.kv_events_replay_port else None
    return f"tcp://127.0.0.1:{cfg.kv_events_port + i}", replay


async def complete(url: str, prompt: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200, await r.text()


async def tokens(url: str, prompt: str) -> list[int]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/tokenize", json={"model": MODEL, "prompt": prompt}) as r:
            return list((await r.json())["tokens"])


async def load(fleet: Any, prompts: list[str]) -> None:
    """Each prompt to engine i % N, all at once."""
    urls = fleet.urls
    await asyncio.gather(*(complete(urls[i % len(urls)], p) for i, p in enumerate(prompts)))


def prompts(tag: str, n: int) -> list[str]:
    return [f"{tag} conversation {i}: " + "the quick brown fox jumps over the lazy dog " * (3 + i % 5)
            for i in range(n)]


def view(index: PreciseIndex, endpoints: list[str], token_lists: list[list[int]]) -> Any:
    """What routing reads: each endpoint's block count and state, and each prompt's hits per endpoint."""
    hits = []
    for toks in token_lists:
        m = index.match(index.keys_for(toks))
        hits.append({ep: m[ep].blocks for ep in endpoints if ep in m})
    return {ep: (index.size(ep), index.state(ep)) for ep in endpoints}, hits


async def _quiet(e: Exception) -> None:
    pass


@pytest.fixture
async def relays(nats_server: Any) -> AsyncIterator[Callable[..., Any]]:
    """In-process relays (KVRelay) to the test's nats-server."""
    made: list[tuple[KVRelay, Any]] = []

    async def start(fleet: Any, i: int, *, url: str | None = None, **kw: Any) -> KVRelay:
        events, replay = engine(fleet, i)
        settings = RelaySettings(events, key(fleet, i), POOL, url or nats_server.url, engine_replay=replay,
                                 **{"ack_timeout": 1.0, **kw})
        nc = await connect(NatsTarget.parse(settings.nats_url), name=f"test relay {i}", error_cb=_quiet)
        r = KVRelay(settings, nc.jetstream())
        await r.start()
        made.append((r, nc))
        return r

    yield start
    for r, nc in made:
        await r.close()
        await nc.close()


@pytest.fixture
async def replicas(nats_server: Any) -> AsyncIterator[Callable[..., JetStreamKVSubscriber]]:
    made: list[JetStreamKVSubscriber] = []

    def start(block_size: int = 16, **kw: Any) -> JetStreamKVSubscriber:
        sub = JetStreamKVSubscriber(PreciseIndex(block_size=block_size), NatsTarget.parse(nats_server.url), **kw)
        sub.follow([POOL])
        made.append(sub)
        return sub

    yield start
    for s in made:
        await s.close()


@pytest.fixture
async def direct() -> AsyncIterator[Callable[[Any], KVEventSubscriber]]:
    """The reference: a replica subscribed to every engine's ZMQ sockets."""
    made: list[KVEventSubscriber] = []

    def start(fleet: Any) -> KVEventSubscriber:
        sub = KVEventSubscriber(PreciseIndex(block_size=16))
        for i in range(len(fleet.urls)):
            events, replay = engine(fleet, i)
            sub.add_endpoint(key(fleet, i), KVEventsSource(events, replay))
        made.append(sub)
        return sub

    yield start
    for s in made:
        await s.close()


async def same_view(fleet: Any, a: PreciseIndex, b: PreciseIndex, texts: list[str], timeout: float = 10.0) -> Any:
    eps = [key(fleet, i) for i in range(len(fleet.urls))]
    toks = [await tokens(fleet.urls[0], t) for t in texts]
    await until(lambda: view(a, eps, toks) == view(b, eps, toks), timeout,
                lambda: f"the same index: {view(a, eps, toks)} vs {view(b, eps, toks)}")
    return view(a, eps, toks)


async def test_a_replica_over_nats_builds_the_index_a_direct_subscription_builds(make_fleet, relays, replicas,
                                                                                   direct) -> None:
    fleet = await make_fleet(2)
    ref = direct(fleet)
    relay = [await relays(fleet, i) for i in range(2)]
    sub = replicas()
    texts = prompts("a", 16)
    await asyncio.sleep(0.3)  # the SUB sockets joined
    await load(fleet, texts)
    sizes, hits = await same_view(fleet, sub.index, ref.index, texts)
    assert all(n > 0 and state == LIVE for n, state in sizes.values()), sizes
    assert sum(1 for h in hits if h) == len(texts)
    assert all(r.counters.holes == 0 and r.counters.published > 0 for r in relay)
    assert sub.metrics.registry.get_sample_value("pointsman_kv_events_gaps_total") == 0
    assert [s.address for s in sub.status()[key(fleet, 0)]] == [subject(POOL, key(fleet, 0), 0)]


async def test_a_late_replica_catches_up_from_the_stream_without_contacting_the_engines(
        make_fleet, nats_server, direct, tmp_path) -> None:
    """The issue's "done when": busy engines, `epp kv-relay` processes, then the engines' sockets closed, and a
    replica (PreciseService over NATS, the endpoints still naming their ZMQ sockets) started afterwards learns
    everything from the stream."""
    fleet = await make_fleet(2)
    ref = direct(fleet)
    procs = []
    for i in range(2):
        events, replay = engine(fleet, i)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "epp.cmd.cli", "kv-relay", "--engine-events", events, "--engine-replay", replay,
             "--endpoint", key(fleet, i), "--pool", POOL, "--nats-url", nats_server.url],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"relay{i}.log", "w"),
            env={**os.environ, "PYTHONPATH": str(ROOT)}))
    try:
        texts = prompts("late", 24)
        await load(fleet, texts[:12])  # before the relays are surely up: they catch up from the engines' replay
        await asyncio.sleep(1.5)
        await load(fleet, texts[12:])
        await same_view(fleet, ref.index, ref.index, texts)
        nc = await connect(NatsTarget.parse(nats_server.url), name="test")
        js = nc.jetstream()
        logs = lambda: "every batch in the stream; relay logs:\n" + "\n".join(  # noqa: E731
            (tmp_path / f"relay{i}.log").read_text()[-2000:] for i in range(2))
        await until(lambda: _stored(js, fleet), 30.0, logs)
        await nc.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    replays_before = [s.publisher.replays_served for s in fleet.servers]
    for s in fleet.servers:  # the engines' KV-event sockets go away: nothing can be asked of them any more
        s.publisher.close()
    ds = Datastore(POOL)
    from epp.fleet.datastore import PoolSpec

    ds.set_pool(PoolSpec(POOL), [Endpoint(key=key(fleet, i), address="127.0.0.1", port=fleet.config.base_port + i,
                                          annotations={"pointsman.ai/kv-events-endpoint": engine(fleet, i)[0]})
                                 for i in range(2)])
    started = time.monotonic()
    svc = PreciseService(ds, nats_url=nats_server.url)
    svc.attach()
    try:
        sizes, _ = await same_view(fleet, svc.index, ref.index, texts)
        caught_up = time.monotonic() - started
        assert all(state == LIVE for _, state in sizes.values())
        assert [s.publisher.replays_served for s in fleet.servers] == replays_before  # no replay asked
        assert svc.status()["subscriptions"][key(fleet, 0)][0].state == LIVE
        print(f"late replica caught up in {caught_up * 1000:.0f} ms")
    finally:
        await svc.close()


async def _stored(js: Any, fleet: Any) -> bool:
    for i, server in enumerate(fleet.servers):
        try:
            msg = await js.get_last_msg(stream_name(POOL), subject(POOL, key(fleet, i), 0))
        except Exception:
            return False
        if int(msg.headers["Pointsman-Seq"][:16], 16) != server.publisher.seq - 1:
            return False
    return True


async def test_a_broker_restart_loses_nothing(make_fleet, nats_server, relays, replicas, direct) -> None:
    fleet = await make_fleet(2)
    ref = direct(fleet)
    relay = [await relays(fleet, i) for i in range(2)]
    sub = replicas(stall=0.5)
    texts = prompts("restart", 30)
    await asyncio.sleep(0.3)
    await load(fleet, texts[:10])
    await same_view(fleet, sub.index, ref.index, texts[:10])
    nats_server.kill()
    await load(fleet, texts[10:20])  # while NATS is down: the relays queue, routing goes on
    await asyncio.sleep(1.5)  # longer than the relays' ack timeout: they resync once NATS is back
    nats_server.restart()
    await load(fleet, texts[20:])
    sizes, _ = await same_view(fleet, sub.index, ref.index, texts, timeout=20.0)
    assert all(state == LIVE for _, state in sizes.values())
    assert sum(r.counters.resyncs for r in relay) >= 1
    assert all(r.counters.holes == 0 for r in relay)
    assert all(not r.publisher.queue for r in relay)  # nothing left over
    assert sub.followers[POOL].resets >= 1
    assert sub.metrics.registry.get_sample_value("pointsman_kv_events_gaps_total") == 0


async def test_a_slow_consumer_is_rebuilt_from_the_stream(make_fleet, relays, replicas, direct) -> None:
    fleet = await make_fleet(2)
    ref = direct(fleet)
    for i in range(2):
        await relays(fleet, i)
    stalls = {"n": 0}

    def slow(endpoint: str, rank: int, batch: Any) -> None:
        if stalls["n"] < 5:
            stalls["n"] += 1
            time.sleep(0.2)  # the loop stands still: the client's small pending queue overflows

    sub = replicas(pending_msgs_limit=4, stall=0.5, on_batch=slow)
    texts = prompts("slow", 40)
    await asyncio.sleep(0.3)
    await load(fleet, texts)
    sizes, _ = await same_view(fleet, sub.index, ref.index, texts, timeout=20.0)
    assert all(state == LIVE for _, state in sizes.values())
    assert sub.slow_consumer > 0  # messages were dropped by the client ...
    assert sub.followers[POOL].resets >= 1  # ... and read again from the stream
    assert sub.metrics.registry.get_sample_value("pointsman_kv_events_gaps_total") == 0


def _stored_event(hashes: list[int], toks: list[int]) -> list[Any]:
    return ["BlockStored", hashes, None, toks, 4, None, "GPU", None, None, 0, None, None]


async def test_restarts_resets_and_holes_keep_the_trust_rules(nats_server, relays, replicas) -> None:
    """An engine that restarts is started afresh; a batch nobody can supply (no replay, a seq skipped) turns the
    rank unknown on every replica; the engine's next cache reset makes it live again."""
    port = free_port()
    pub = KVEventPublisher(f"tcp://127.0.0.1:{port}", "", 4)
    fleet = _OneEngine(port)
    await relays(fleet, 0)
    sub = replicas(block_size=4)
    ep = key(fleet, 0)
    await until(lambda: pub.subscriptions() > 0, 5.0)
    old, new = list(range(8)), list(range(100, 108))
    pub.publish_events([_stored_event([1, 2], old)])
    await until(lambda: ep in sub.index.match(sub.index.keys_for(old)), 5.0)
    pub.close()
    pub = await bind_again(port)  # restarted: seq 0 again, its cache empty
    try:
        await until(lambda: pub.subscriptions() > 0, 5.0)
        pub.publish_events([_stored_event([9], new[:4])])
        await until(lambda: ep in sub.index.match(sub.index.keys_for(new)), 5.0)
        assert ep not in sub.index.match(sub.index.keys_for(old))
        assert sub.metrics.registry.get_sample_value("pointsman_kv_events_restarts_total") == 1
        pub.seq += 1  # a batch lost on the way to the relay, and no replay to ask
        pub.publish_events([_stored_event([10], new[4:])])
        await until(lambda: sub.index.state(ep) == UNKNOWN, 5.0)
        pub.publish_events([["AllBlocksCleared"]])
        pub.publish_events([_stored_event([11], old[:4])])
        await until(lambda: sub.index.state(ep) == LIVE
                    and ep in sub.index.match(sub.index.keys_for(old[:4])), 5.0)
    finally:
        pub.close()


async def bind_again(port: int) -> KVEventPublisher:
    async def bound() -> KVEventPublisher | None:
        try:
            return KVEventPublisher(f"tcp://127.0.0.1:{port}", "", 4)
        except zmq.ZMQError:  # a just-closed ZMQ socket releases its port asynchronously
            return None

    return await until(bound, 5.0, f"port {port} free again")  # type: ignore[no-any-return]


class _OneEngine:
    """A bare publisher where the helpers expect a modelsim fleet (no replay socket)."""

    def __init__(self, port: int) -> None:
        self.config = type("C", (), {"base_port": 8000, "kv_events_port": port, "kv_events_replay_port": None})()
        self.urls = [""]


def test_relayed_payload_is_the_engines_bytes() -> None:
    payload = msgpack.packb([1.0, [["AllBlocksCleared"]], 0])
    from epp.fleet.kvevents.natswire import headers, unwrap

    seq = (7).to_bytes(8, "big") + b"s" * 16
    env = unwrap(headers("10.0.0.5:8000", 1, b"kv@x", seq), payload)
    assert env == ("10.0.0.5:8000", 1, [b"kv@x", seq, payload])
    assert subject("my.pool", "10.0.0.5:8000", 1) == "pointsman.kv.my_pool.10_0_0_5_8000.1"


async def test_a_relay_restart_resumes_after_the_streams_last_batch(make_fleet, relays, replicas, direct) -> None:
    fleet = await make_fleet(1)
    ref = direct(fleet)
    first = await relays(fleet, 0)
    sub = replicas()
    texts = prompts("relay-restart", 12)
    await asyncio.sleep(0.3)
    await load(fleet, texts[:6])
    await same_view(fleet, sub.index, ref.index, texts[:6])
    await first.close()
    before = fleet.servers[0].publisher.seq
    await load(fleet, texts[6:])  # nobody relays these: only the engine's replay has them
    missed = fleet.servers[0].publisher.seq - before
    second = await relays(fleet, 0)
    sizes, _ = await same_view(fleet, sub.index, ref.index, texts)
    assert all(state == LIVE for _, state in sizes.values())
    assert second.counters.replayed == missed > 0  # exactly what the stream lacked, nothing published twice
    assert second.counters.duplicates == 0 and second.counters.holes == 0
    value = sub.metrics.registry.get_sample_value
    assert value("pointsman_kv_events_restarts_total") == 0 and value("pointsman_kv_events_gaps_total") == 0


async def test_a_full_relay_queue_is_refilled_from_the_engines_replay(make_fleet, nats_server, relays, replicas,
                                                                      direct) -> None:
    fleet = await make_fleet(1)
    ref = direct(fleet)
    relay = await relays(fleet, 0, max_pending=2)
    sub = replicas(stall=0.5)
    texts = prompts("overflow", 16)
    await asyncio.sleep(0.3)
    await load(fleet, texts[:4])
    await same_view(fleet, sub.index, ref.index, texts[:4])
    nats_server.kill()
    for t in texts[4:]:  # one batch at a time: more than the queue holds
        await complete(fleet.urls[0], t)
    await asyncio.sleep(1.5)
    nats_server.restart()
    sizes, _ = await same_view(fleet, sub.index, ref.index, texts, timeout=20.0)
    assert all(state == LIVE for _, state in sizes.values())
    assert relay.counters.overflow > 0 and relay.counters.holes == 0
    assert not relay.publisher.queue
    assert sub.metrics.registry.get_sample_value("pointsman_kv_events_gaps_total") == 0


async def test_data_parallel_ranks_travel_apart(nats_server, relays, replicas) -> None:
    """One relay per rank (rank r publishes on the endpoint's port + r): each rank is its own slot on the replica."""
    base = free_port()
    pubs = [await bind_dp(base, r) for r in range(2)]
    fleet = _OneEngine(base)
    try:
        for r in range(2):
            fleet.config.kv_events_port = base + r
            await relays(fleet, 0, rank=r)
        sub = replicas(block_size=4)
        ep = key(fleet, 0)
        await until(lambda: all(p.subscriptions() > 0 for p in pubs), 5.0)
        toks = list(range(12))
        pubs[0].publish_events([_stored_event([1, 2, 3], toks)])
        pubs[1].publish_events([_stored_event([1], toks[:4])])  # the same engine hash on the other rank
        keys = sub.index.keys_for(toks)
        await until(lambda: sub.index.slot_states(ep) == {0: LIVE, 1: LIVE}
                    and ep in sub.index.match(keys) and sub.index.match(keys)[ep].blocks == 3, 5.0)
        pubs[0].publish_events([["AllBlocksCleared"]])
        await until(lambda: ep in sub.index.match(keys) and sub.index.match(keys)[ep].rank == 1, 5.0)
        assert [s.address for s in sub.status()[ep]] == [subject(POOL, ep, 0), subject(POOL, ep, 1)]
    finally:
        for p in pubs:
            p.close()


async def bind_dp(base: int, rank: int) -> KVEventPublisher:
    return KVEventPublisher(f"tcp://127.0.0.1:{base}", "", 4, dp_rank=rank)


async def test_the_relay_command_waits_for_nats(make_fleet, nats_server, direct, tmp_path) -> None:
    """`epp kv-relay` started while NATS is down retries, then relays everything once NATS is up."""
    fleet = await make_fleet(1)
    ref = direct(fleet)
    nats_server.kill()
    events, replay = engine(fleet, 0)
    log = open(tmp_path / "relay.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "kv-relay", "--engine-events", events, "--engine-replay", replay,
         "--endpoint", key(fleet, 0), "--pool", POOL, "--nats-url", nats_server.url],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        await until(lambda: "retrying" in (tmp_path / "relay.log").read_text(), 30.0, "the relay retries")
        texts = prompts("waits", 6)
        await load(fleet, texts)
        nats_server.restart()
        sub = JetStreamKVSubscriber(PreciseIndex(block_size=16), NatsTarget.parse(nats_server.url))
        sub.follow([POOL])
        try:
            await same_view(fleet, sub.index, ref.index, texts, timeout=30.0)
            assert sub.index.state(key(fleet, 0)) == LIVE
        finally:
            await sub.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        log.close()


async def test_an_engine_that_restarted_while_its_relay_was_down_starts_afresh(nats_server, relays,
                                                                                replicas) -> None:
    port, rport = free_port(), free_port()
    fleet = _OneEngine(port)
    fleet.config.kv_events_replay_port = rport

    def publisher() -> KVEventPublisher:
        return KVEventPublisher(f"tcp://127.0.0.1:{port}", "", 4, f"tcp://127.0.0.1:{rport}")

    pub = publisher()
    first = await relays(fleet, 0)
    sub = replicas(block_size=4)
    ep = key(fleet, 0)
    old, new = list(range(8)), list(range(100, 104))
    await until(lambda: pub.subscriptions() > 0, 5.0)
    for h in range(3):  # seq 0..2
        pub.publish_events([_stored_event([h + 1], old[4 * (h % 2):4 * (h % 2) + 4])])
    await until(lambda: ep in sub.index.match(sub.index.keys_for(old[:4])), 5.0)
    await first.close()
    pub.close()
    await asyncio.sleep(0.2)  # a just-closed ZMQ socket releases its ports asynchronously
    pub = await until(lambda: _try(publisher), 5.0)  # the engine restarted: seq 0 again, its cache empty
    try:
        pub.publish_events([_stored_event([9], new)])  # seq 0, published while no relay runs; then idle
        second = await relays(fleet, 0)
        await until(lambda: ep in sub.index.match(sub.index.keys_for(new)), 5.0)
        assert ep not in sub.index.match(sub.index.keys_for(old[:4]))
        assert sub.index.state(ep) == LIVE
        assert sub.metrics.registry.get_sample_value("pointsman_kv_events_restarts_total") == 1
        assert second.counters.replayed == 1 and second.epoch == 1
    finally:
        pub.close()


def _try(make: Callable[[], KVEventPublisher]) -> KVEventPublisher | None:
    try:
        return make()
    except zmq.ZMQError:
        return None

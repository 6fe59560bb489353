"""The KV-event subscriber against modelsim over real ZMQ sockets: events applied, gaps replayed, failed replays
marking the endpoint unknown, cache resets, unreachable publishers, restarts, data-parallel ranks."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.fleet.kvevents.decode import BlockStored, DecodeError, decode_message
from epp.fleet.kvevents.metrics import KVEventMetrics
from epp.fleet.kvevents.sources import KVEventsSource
from epp.fleet.kvevents.subscriber import KVEventSubscriber
from epp.stack.ports import free_port, free_port_block
from modelsim.kvevents import KVEventPublisher
from scheduling.prefix.precise import LIVE, PENDING, UNKNOWN, PreciseIndex
from scheduling.prefix.token_keys import chain_keys
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"


def _source(fleet, i: int = 0, topic: str = "") -> KVEventsSource:
    cfg = fleet.config
    replay = f"tcp://127.0.0.1:{cfg.kv_events_replay_port + i}" if cfg.kv_events_replay_port else None
    return KVEventsSource(f"tcp://127.0.0.1:{cfg.kv_events_port + i}", replay, topic)


async def _tokens(url: str, prompt: str) -> list[int]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/tokenize", json={"model": MODEL, "prompt": prompt}) as r:
            assert r.status == 200
            return (await r.json())["tokens"]


async def _complete(url: str, prompt: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200, await r.text()


def _value(metrics: KVEventMetrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


@pytest.fixture
async def subscriber():
    made: list[KVEventSubscriber] = []

    def make(index: PreciseIndex | None = None, **kw) -> KVEventSubscriber:
        sub = KVEventSubscriber(index if index is not None else PreciseIndex(block_size=16), **kw)
        made.append(sub)
        return sub

    yield make
    for s in made:
        await s.close()


@pytest.mark.parametrize(("encoding", "style", "hashes"),
                         [("array", "vllm", "int"), ("map", "vllm", "bytes"), ("array", "sglang", "int")])
async def test_modelsim_events_are_applied(make_fleet, subscriber, encoding: str, style: str, hashes: str) -> None:
    fleet = await make_fleet(1, kv_events_encoding=encoding, kv_events_style=style, kv_events_hash_format=hashes)
    url = fleet.urls[0]
    seen: list[BlockStored] = []
    sub = subscriber(on_batch=lambda k, r, b: seen.extend(e for e in b.events if isinstance(e, BlockStored)))
    sub.add_endpoint("sim-0", _source(fleet))
    assert sub.index.state("sim-0") == PENDING
    prompt = "The system prompt of a long conversation. " * 10  # 430 chars -> 108 tokens -> 6 full blocks
    await _complete(url, prompt)
    tokens = await _tokens(url, prompt)
    keys = sub.index.keys_for(tokens)
    cached = (len(tokens) - 1) // 16  # the engine never caches the block holding the last prompt token
    await until(lambda: sub.index.match(keys).get("sim-0") is not None
                and sub.index.match(keys)["sim-0"].blocks == cached, 3.0)
    m = sub.index.match(keys)["sim-0"]
    assert m.gpu == cached and m.speculative == 0 and m.state == LIVE
    # Pointsman's keys from /tokenize ids equal the keys from the BlockStored token ids
    event_tokens = [t for e in seen for t in e.token_ids]
    assert chain_keys(event_tokens, 16) == keys[:cached]
    assert modelsim_probe(fleet, tokens) == cached * 16
    assert _value(sub.metrics, "pointsman_kv_events_blocks_total", op="stored") >= cached


def modelsim_probe(fleet, tokens: list[int]) -> int:
    return fleet.servers[0].engine.probe(tokens)


async def test_a_gap_is_filled_by_replay(make_fleet, subscriber) -> None:
    fleet = await make_fleet(1)
    url = fleet.urls[0]
    prompts = [f"prompt number {i} " * 12 for i in range(4)]
    for p in prompts[:3]:  # published while nobody listens: seq 0..2 only the replay buffer has
        await _complete(url, p)
    # the gap, not the catch-up of a rank that heard nothing yet, must find the missing history: under load the
    # 0.3 s below plus a request can outlast the default catch_up_after, which would replay it first
    sub = subscriber(catch_up_after=None)
    sub.add_endpoint("sim-0", _source(fleet))
    await asyncio.sleep(0.3)  # connected
    await _complete(url, prompts[3])  # seq 3 arrives: a gap from 0
    for p in prompts:
        toks = await _tokens(url, p)
        keys = sub.index.keys_for(toks)
        await until(lambda k=keys, t=toks: sub.index.match(k).get("sim-0") is not None
                    and sub.index.match(k)["sim-0"].blocks == (len(t) - 1) // 16, 3.0)
    assert sub.index.state("sim-0") == LIVE
    m = sub.metrics
    assert _value(m, "pointsman_kv_events_gaps_total") == 1
    assert _value(m, "pointsman_kv_events_replays_total", outcome="ok") == 1
    assert _value(m, "pointsman_kv_events_batches_total", source="replay") == 3
    assert fleet.servers[0].publisher.replays_served == 1
    when, what, minor = sub.index.disrupted["sim-0"]  # the prefix trust sees the gap the replay filled
    assert what == "gap of 3 batches replayed" and minor


@pytest.mark.parametrize("replay", [False, True])
async def test_a_failed_replay_marks_the_endpoint_unknown(make_fleet, subscriber, replay: bool) -> None:
    # without a replay socket, or with a buffer too short to hold the missing batches
    fleet = await make_fleet(1, replay=replay, kv_events_buffer_steps=1)
    url = fleet.urls[0]
    for i in range(3):
        await _complete(url, f"early {i} " * 20)
    sub = subscriber(catch_up_after=None)  # the gap asks the replay (see test_a_gap_is_filled_by_replay)
    sub.add_endpoint("sim-0", _source(fleet))
    await asyncio.sleep(0.3)
    late = "late prompt " * 20
    await _complete(url, late)
    await until(lambda: sub.index.state("sim-0") == UNKNOWN, 3.0)
    outcome = "incomplete" if replay else "unavailable"
    assert _value(sub.metrics, "pointsman_kv_events_replays_total", outcome=outcome) == 1
    assert _value(sub.metrics, "pointsman_kv_events_unknown_total") == 1
    assert sub.index.disrupted["sim-0"][1:] == ("batches lost", False)
    # what arrives after the gap is still applied (true, if incomplete), and reported as unknown
    keys = sub.index.keys_for(await _tokens(url, late))
    await until(lambda: "sim-0" in sub.index.match(keys), 3.0)
    assert sub.index.match(keys)["sim-0"].state == UNKNOWN
    early = sub.index.keys_for(await _tokens(url, "early 0 " * 20))
    assert "sim-0" not in sub.index.match(early)  # lost with the gap
    # AllBlocksCleared makes the view exact again
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/reset_prefix_cache") as r:
            assert r.status == 200
    await until(lambda: sub.index.state("sim-0") == LIVE, 3.0)
    assert sub.index.match(keys) == {}


async def test_a_cache_reset_takes_effect_within_100ms(make_fleet, subscriber) -> None:
    fleet = await make_fleet(1)
    url = fleet.urls[0]
    sub = subscriber()
    sub.add_endpoint("sim-0", _source(fleet))
    await asyncio.sleep(0.3)
    prompt = "a shared system prompt " * 20
    await _complete(url, prompt)
    keys = sub.index.keys_for(await _tokens(url, prompt))
    await until(lambda: "sim-0" in sub.index.match(keys), 3.0)
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(f"{url}/reset_prefix_cache") as r:
            assert r.status == 200
        await until(lambda: sub.index.match(keys) == {}, 1.0, interval=0.001)
        took = time.monotonic() - t0
    assert took < 0.1, f"the reset reached the index after {took * 1000:.0f} ms"
    assert sub.index.state("sim-0") == LIVE
    assert _value(sub.metrics, "pointsman_kv_events_events_total", type="AllBlocksCleared") == 1


async def test_an_unreachable_publisher_blocks_nothing(make_fleet, subscriber) -> None:
    fleet = await make_fleet(1)
    url = fleet.urls[0]
    sub = subscriber(replay_timeout=0.5)
    dead = KVEventsSource(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    gone = KVEventsSource("tcp://192.0.2.1:5557", "tcp://192.0.2.1:5558")  # TEST-NET: never answers
    t0 = time.monotonic()
    sub.add_endpoint("dead", dead)
    sub.add_endpoint("gone", gone)
    sub.add_endpoint("sim-0", _source(fleet))
    assert time.monotonic() - t0 < 0.25  # (a blocking connect to TEST-NET would take minutes)
    # the loop stays responsive while the sockets try to connect
    lags = []
    for _ in range(20):
        t = time.monotonic()
        await asyncio.sleep(0.005)
        lags.append(time.monotonic() - t - 0.005)
    assert max(lags) < 0.25
    prompt = "still routed " * 20
    await _complete(url, prompt)
    keys = sub.index.keys_for(await _tokens(url, prompt))
    await until(lambda: "sim-0" in sub.index.match(keys), 3.0)
    assert sub.index.state("dead") == PENDING and sub.index.state("gone") == PENDING
    t0 = time.monotonic()
    sub.remove_endpoint("gone")
    sub.remove_endpoint("dead")
    assert time.monotonic() - t0 < 0.25 and set(sub.sources()) == {"sim-0"}


async def test_a_replay_socket_that_never_answers_stalls_only_its_endpoint(make_fleet, subscriber) -> None:
    fleet = await make_fleet(2, replay=False)
    a, b = fleet.urls
    sub = subscriber(replay_timeout=1.0, catch_up_after=None)  # the gap asks the replay, not a catch-up
    silent = _source(fleet, 0)
    silent = KVEventsSource(silent.endpoint, f"tcp://127.0.0.1:{free_port()}")  # nothing listens there
    await _complete(a, "before " * 20)  # seq 0 on server 0, unseen: its first batch seen will be a gap
    sub.add_endpoint("sim-0", silent)
    sub.add_endpoint("sim-1", _source(fleet, 1))
    await asyncio.sleep(0.3)
    await _complete(a, "after " * 20)  # server 0's rank waits for its replay until the timeout
    prompt = "other server " * 20
    t0 = time.monotonic()
    await _complete(b, prompt)
    keys = sub.index.keys_for(await _tokens(b, prompt))
    await until(lambda: "sim-1" in sub.index.match(keys), 3.0)
    assert time.monotonic() - t0 < 0.9  # applied while sim-0 still waits
    await until(lambda: sub.index.state("sim-0") == UNKNOWN, 3.0)
    assert _value(sub.metrics, "pointsman_kv_events_replays_total", outcome="timeout") == 1


async def test_remove_endpoint_takes_subscription_and_index_entries(make_fleet, subscriber) -> None:
    fleet = await make_fleet(1)
    url = fleet.urls[0]
    sub = subscriber()
    sub.add_endpoint("sim-0", _source(fleet))
    await asyncio.sleep(0.3)
    prompt = "to be forgotten " * 20
    await _complete(url, prompt)
    keys = sub.index.keys_for(await _tokens(url, prompt))
    await until(lambda: "sim-0" in sub.index.match(keys), 3.0)
    sub.sync({})
    assert sub.sources() == {} and "sim-0" not in sub.index.endpoints() and len(sub.index) == 0
    await _complete(url, "more traffic " * 20)
    await asyncio.sleep(0.2)
    assert len(sub.index) == 0 and sub.index.state("sim-0") is None
    assert _value(sub.metrics, "pointsman_kv_events_subscriptions") == 0


async def _publisher(port: int, replay_port: int | None = None, rank: int = 0) -> KVEventPublisher:
    replay = f"tcp://127.0.0.1:{replay_port}" if replay_port else None
    for _ in range(50):  # a just-closed ZMQ socket releases its port asynchronously
        try:
            return KVEventPublisher(f"tcp://127.0.0.1:{port}", "kv@test", 4, replay, dp_rank=rank)
        except zmq.ZMQError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"port {port} stayed in use")


def _stored(h: list[int], parent: int | None, tokens: list[int]) -> list:
    return ["BlockStored", h, parent, tokens, 4, None, "GPU", None, None, 0, None, None]


async def test_data_parallel_ranks_are_kept_apart(subscriber) -> None:
    base, rbase = free_port_block(2), free_port_block(2)
    p0, p1 = await _publisher(base, rbase, 0), await _publisher(base, rbase, 1)
    try:
        assert p1.endpoint == f"tcp://127.0.0.1:{base + 1}"
        sub = subscriber(PreciseIndex(block_size=4))
        sub.add_endpoint("dp", KVEventsSource(f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{rbase}", "kv@", 2))
        await asyncio.sleep(0.3)
        toks = list(range(12))
        p0.publish_events([_stored([1, 2, 3], None, toks)])
        p1.publish_events([_stored([1], None, toks[:4])])  # same engine hash 1 on the other rank: no clash
        keys = sub.index.keys_for(toks)
        await until(lambda: sub.index.slot_states("dp") == {0: LIVE, 1: LIVE}
                    and sub.index.match(keys).get("dp") is not None
                    and sub.index.match(keys)["dp"].blocks == 3, 3.0)
        assert sub.index.match(keys)["dp"].rank == 0
        p0.publish_events([["AllBlocksCleared"]])
        await until(lambda: sub.index.match(keys).get("dp") is not None
                    and sub.index.match(keys)["dp"].rank == 1, 3.0)
        assert sub.index.match(keys)["dp"].blocks == 1
        assert [s.address for s in sub.status()["dp"]] == [f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"]
    finally:
        p0.close()
        p1.close()


async def test_a_restarted_publisher_starts_the_endpoint_afresh(subscriber) -> None:
    port = free_port()
    pub = await _publisher(port)
    sub = subscriber(PreciseIndex(block_size=4))
    sub.add_endpoint("r", KVEventsSource(f"tcp://127.0.0.1:{port}"))
    await asyncio.sleep(0.3)
    old, new = list(range(8)), list(range(100, 108))
    for _ in range(3):
        pub.publish_events([])  # seq 0..2
    pub.publish_events([_stored([1, 2], None, old)])  # seq 3
    await until(lambda: "r" in sub.index.match(sub.index.keys_for(old)), 3.0)
    pub.close()
    pub = await _publisher(port)  # the engine restarted: seq from 0 again, its cache empty
    try:
        await asyncio.sleep(0.5)  # the SUB socket reconnects by itself
        pub.publish_events([_stored([9], None, new[:4])])
        await until(lambda: "r" in sub.index.match(sub.index.keys_for(new)), 3.0)
        assert "r" not in sub.index.match(sub.index.keys_for(old))
        assert sub.index.state("r") == LIVE
        assert _value(sub.metrics, "pointsman_kv_events_restarts_total") == 1
        assert sub.index.disrupted["r"][1:] == ("publisher restarted", False)
    finally:
        pub.close()


async def test_topic_filter(subscriber) -> None:
    port = free_port()
    pub = await _publisher(port)  # topic "kv@test"
    try:
        sub = subscriber(PreciseIndex(block_size=4))
        sub.add_endpoint("other", KVEventsSource(f"tcp://127.0.0.1:{port}", topic="kv@prod"))
        sub.add_endpoint("mine", KVEventsSource(f"tcp://127.0.0.1:{port}", topic="kv@te"))
        await asyncio.sleep(0.3)
        pub.publish_events([_stored([1], None, [1, 2, 3, 4])])
        await until(lambda: "mine" in sub.index.match(sub.index.keys_for([1, 2, 3, 4])), 3.0)
        await asyncio.sleep(0.1)
        assert sub.index.state("other") == PENDING and sub.status()["other"][0].batches == 0
    finally:
        pub.close()


async def test_unknown_event_types_and_other_tiers_are_ignored_not_fatal(subscriber) -> None:
    port = free_port()
    pub = await _publisher(port)
    try:
        sub = subscriber(PreciseIndex(block_size=4))
        sub.add_endpoint("x", KVEventsSource(f"tcp://127.0.0.1:{port}"))
        await asyncio.sleep(0.3)
        pub.publish_events([["BlockPinned", [1]], ["BlockStored", [5], None, [1, 2, 3, 4], 4, None, "DISK"],
                            _stored([1], None, [1, 2, 3, 4])])
        await until(lambda: "x" in sub.index.match(sub.index.keys_for([1, 2, 3, 4])), 3.0)
        assert _value(sub.metrics, "pointsman_kv_events_events_total", type="ignored") == 2
        assert _value(sub.metrics, "pointsman_kv_events_events_total", type="BlockStored") == 1
        assert sub.index.state("x") == LIVE
    finally:
        pub.close()


async def test_raw_zmq_sub_sees_what_subscriber_sees(make_fleet) -> None:
    """Sanity check of the test setup itself: modelsim's PUB is reachable with a plain SUB socket."""
    fleet = await make_fleet(1)
    s = zmq.asyncio.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(_source(fleet).endpoint)
    await asyncio.sleep(0.3)
    await _complete(fleet.urls[0], "x" * 100)
    frames = await asyncio.wait_for(s.recv_multipart(), 2.0)
    s.close(0)
    assert len(frames) == 3


async def test_history_is_caught_up_without_new_traffic(make_fleet, subscriber) -> None:
    fleet = await make_fleet(1)
    url = fleet.urls[0]
    prompts = [f"history {i} " * 20 for i in range(3)]
    for p in prompts:
        await _complete(url, p)
    sub = subscriber(catch_up_after=0.3)
    sub.add_endpoint("sim-0", _source(fleet))
    await until(lambda: sub.index.state("sim-0") == LIVE, 3.0)
    for p in prompts:
        keys = sub.index.keys_for(await _tokens(url, p))
        assert "sim-0" in sub.index.match(keys)
    assert _value(sub.metrics, "pointsman_kv_events_batches_total", source="replay") == 3
    await _complete(url, "after the catch-up " * 20)  # the next live batch follows on
    keys = sub.index.keys_for(await _tokens(url, "after the catch-up " * 20))
    await until(lambda: "sim-0" in sub.index.match(keys), 3.0)
    assert _value(sub.metrics, "pointsman_kv_events_gaps_total") == 0


async def test_an_idle_fresh_engine_becomes_live(make_fleet, subscriber) -> None:
    fleet = await make_fleet(2)
    sub = subscriber(catch_up_after=0.2)
    sub.add_endpoint("fresh", _source(fleet, 0))
    no_replay = _source(fleet, 1)
    sub.add_endpoint("no-replay", KVEventsSource(no_replay.endpoint))
    await until(lambda: sub.index.state("fresh") == LIVE, 3.0)
    assert sub.index.state("no-replay") == PENDING  # nothing can tell whether it is fresh


_frames = st.lists(st.binary(max_size=40), min_size=1, max_size=5)
_payload = st.one_of(
    st.binary(max_size=60),
    st.builds(lambda ev, rank: msgpack.packb([1.0, ev, rank], use_bin_type=True),
              st.lists(st.one_of(st.lists(st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=12),
                                                    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3)),
                                          max_size=8),
                                 st.dictionaries(st.sampled_from(["type", "block_hashes", "token_ids", "block_size",
                                                                  "parent_block_hash", "medium"]),
                                                 st.one_of(st.none(), st.integers(-3, 40), st.text(max_size=12),
                                                           st.lists(st.integers(0, 9), max_size=4)), max_size=6)),
                       max_size=4),
              st.one_of(st.none(), st.integers(-2, 2), st.text(max_size=3))),
)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(_frames.map(lambda f: ("raw", f)), _payload.map(lambda p: ("payload", p))),
                min_size=20, max_size=40))
def test_fuzzed_messages_do_not_kill_the_subscriber(messages: list) -> None:
    asyncio.run(_fuzz(messages))


async def _fuzz(messages: list) -> None:
    port = free_port()
    pub = await _publisher(port)
    sock = pub._sock
    sub = KVEventSubscriber(PreciseIndex(block_size=4))
    try:
        sub.add_endpoint("f", KVEventsSource(f"tcp://127.0.0.1:{port}"))
        await asyncio.sleep(0.3)
        bad = 0
        seq = 0
        for kind, item in messages:
            frames = item if kind == "raw" else [b"kv@test", seq.to_bytes(8, "big"), item]
            if kind == "payload":
                seq += 1
            try:
                decode_message(frames)
            except DecodeError:
                bad += 1
            sock.send_multipart(frames)
        # then a valid reset and a store at the next seq: the subscriber is alive and exact again
        sock.send_multipart([b"kv@test", seq.to_bytes(8, "big"),
                             msgpack.packb([1.0, [["AllBlocksCleared"], _stored([1], None, [1, 2, 3, 4])], 0])])
        await until(lambda: "f" in sub.index.match(sub.index.keys_for([1, 2, 3, 4])), 3.0)
        assert sub.index.state("f") == LIVE
        malformed = sum(_value(sub.metrics, "pointsman_kv_events_malformed_total", reason=r)
                        for r in ("frames", "seq", "payload"))
        assert malformed == bad
        assert _value(sub.metrics, "pointsman_kv_events_errors_total") == 0
        assert all(t is not None and not t.done() for _, ranks in sub._subs.values() for t in [ranks[0].task])
    finally:
        await sub.close()
        pub.close()

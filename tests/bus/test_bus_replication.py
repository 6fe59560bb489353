"""Two real `epp serve` Apps joined by the replica bus (real ZMQ, real gRPC ext_proc streams): shared in-flight
load, replicated prefix picks, backlog and session bindings; hot reload re-wires; a replica that joins converges
within 1 s; a partitioned one routes on its own view; endpoints one replica does not know never get state there;
hostile messages to a running replica are dropped and counted."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
from pathlib import Path

import aiohttp
import msgpack
import pytest
import yaml
import zmq
import zmq.asyncio

from epp.bus.codec import MAGIC, BusMessage, encode
from epp.cmd.app import App
from epp.stack.ports import free_port
from tests.support.backend import EchoFleet
from tests.support.extproc_requests import chat, open_request, route, stub_for
from tests.support.stack import serve_args
from tests.support.wait import until

SESSION_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
- type: estimated-latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: session-affinity-scorer, weight: 10}
  - {pluginRef: estimated-latency-scorer, weight: 1}
  - pluginRef: max-score-picker
"""

PREFIX_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def endpoints_file(path: Path, ports: list[int]) -> Path:
    doc = {"pools": [{"name": "pool", "endpoints": [
        {"address": "127.0.0.1", "port": p, "name": f"echo-{p}"} for p in ports]}]}
    path.write_text(yaml.safe_dump(doc))
    return path


class Replica:
    """One `epp serve` App with its bus on 127.0.0.1:<port>."""

    def __init__(self, tmp: Path, name: str, ports: list[int], bus_port: int, peers: list[str], *extra: str) -> None:
        self.bus_port = bus_port
        self.address = f"127.0.0.1:{bus_port}"
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        eps = endpoints_file(tmp / f"{name}-endpoints.yaml", ports)
        self.args = serve_args("--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
                               "--dashboard", "false", "--endpoints-file", str(eps), "--bus-address", "127.0.0.1",
                               "--bus-port", str(bus_port), "--bus-peers", ",".join(peers), *extra)
        self.app: App | None = None
        self.channel, self.stub = None, None

    async def start(self) -> Replica:
        self.app = App(self.args)
        await self.app.start()
        self.channel, self.stub = stub_for(self.grpc_port)
        return self

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.app is not None:
            await self.app.stop(0)
        self.app = None

    @property
    def bus(self):
        return self.app.bus.bus

    @property
    def inflight(self):
        return self.app.datastore.inflight

    def plugin(self, type_name: str):
        return next(p for p in self.app.director.scheduler.plugins() if p.type_name == type_name)

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            return await r.text()


@pytest.fixture
async def pair(tmp_path, fleet):
    pa, pb = free_port(), free_port()
    peers = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
    a = await Replica(tmp_path, "a", fleet, pa, peers).start()
    b = await Replica(tmp_path, "b", fleet, pb, peers).start()
    await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "the replicas hear each other")
    yield a, b
    await a.stop()
    await b.stop()


def requests_on(replica: Replica, key: str) -> int:
    return replica.inflight.get(key).requests


async def test_in_flight_load_and_backlog_are_shared(pair):
    a, b = pair
    held = [await open_request(a.stub, chat("x" * 2000 + str(i))) for i in range(3)]
    keys = {r.endpoint for r in held}
    await until(lambda: all(requests_on(b, k) == requests_on(a, k) for k in keys), 1.0, "b sees a's load")
    assert sum(requests_on(b, k) for k in keys) == 3
    assert b.inflight.local_view() == {}  # b publishes only its own
    # a's share of the prefill backlog is part of b's queue model
    scorer_b = b.plugin("estimated-latency-scorer")
    await until(lambda: scorer_b.model.backlog.peers() == [a.address], 1.0, "a's backlog share at b")
    for r in held:
        await r.finish()
    await until(lambda: all(requests_on(b, k) == 0 for k in keys), 1.0, "a's releases reach b")
    assert b.inflight.view() == {}


async def test_prefix_picks_on_one_replica_guide_the_other(tmp_path, fleet):
    # Prefix alone decides (ties broken at random): b can only follow a's picks through a's replicated records.
    pa, pb = free_port(), free_port()
    peers = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
    a = await Replica(tmp_path, "a", fleet, pa, peers, "--config-text", PREFIX_CONFIG).start()
    b = await Replica(tmp_path, "b", fleet, pb, peers, "--config-text", PREFIX_CONFIG).start()
    try:
        await _follow(a, b)
    finally:
        await a.stop()
        await b.stop()


async def _follow(a: Replica, b: Replica) -> None:
    await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "connected")
    prompts = [f"system prompt {i} " * 200 for i in range(6)]
    picked = [await route(a.stub, chat(p)) for p in prompts]
    # b has routed nothing: only a's replicated records can make it follow a's picks for the same prefixes
    await until(lambda: b.app.bus.replication.applied and sum(b.app.bus.replication.applied.values()) >= 6, 1.0, "a's records applied at b")
    again = [await route(b.stub, chat(p + " and a follow-up question")) for p in prompts]
    assert again == picked
    assert len(set(picked)) > 1  # the picks were spread: following them is not a coincidence


async def test_session_bindings_follow_the_session_across_replicas(tmp_path, fleet):
    cfg = tmp_path / "sched.yaml"
    cfg.write_text(SESSION_CONFIG)
    pa, pb = free_port(), free_port()
    peers = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
    a = await Replica(tmp_path, "a", fleet, pa, peers, "--config-file", str(cfg)).start()
    b = await Replica(tmp_path, "b", fleet, pb, peers, "--config-file", str(cfg)).start()
    try:
        await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "connected")
        sessions = [f"user-{i}" for i in range(6)]
        held = {s: await open_request(a.stub, chat("hi"), **{"x-session-id": s}) for s in sessions}  # spread by load
        first = {s: r.endpoint for s, r in held.items()}
        for r in held.values():
            await r.finish()
        assert len(set(first.values())) == 3
        aff_b = b.plugin("session-affinity-scorer")
        await until(lambda: len(aff_b.sessions) == 6, 1.0, "bindings at b")
        for s in sessions:
            assert await route(b.stub, chat("more"), **{"x-session-id": s}) == first[s]
        # hot reload on b: the new scheduler's plugins replicate, a's new bindings reach them
        old = aff_b
        cfg.write_text(SESSION_CONFIG + "\n# reloaded\n")
        await until(lambda: b.plugin("session-affinity-scorer") is not old, 5.0, "b reloaded")
        assert any(name.endswith(":session-affinity") for name in b.bus.channels())
        late = await route(a.stub, chat("hi"), **{"x-session-id": "late-user"})
        await until(lambda: len(b.plugin("session-affinity-scorer").sessions) >= 1, 1.0, "new binding at b")
        assert await route(b.stub, chat("again"), **{"x-session-id": "late-user"}) == late
    finally:
        await a.stop()
        await b.stop()


async def test_agent_sessions_follow_across_replicas_with_the_default_profile(pair):
    """The built-in default's agent-session-scorer replicates its bindings: a later turn decided by the other
    replica goes where the session's context is."""
    a, b = pair
    sessions = [f"agent-{i}" for i in range(6)]
    held = {s: await open_request(a.stub, chat("plan"), **{"x-session-id": s}) for s in sessions}  # spread by load
    first = {s: r.endpoint for s, r in held.items()}
    for r in held.values():
        await r.finish()
    assert len(set(first.values())) == 3
    agent_b = b.plugin("agent-session-scorer")
    await until(lambda: len(agent_b.table) == 6 and len(agent_b.board) == 6, 1.0, "bindings and warm at b")
    assert any(name.endswith(":agent-session") for name in b.bus.channels())
    for s in sessions:
        assert await route(b.stub, chat("tool result"), **{"x-session-id": s}) == first[s]


async def test_a_replica_that_joins_converges_within_one_second(tmp_path, fleet):
    pa, pb = free_port(), free_port()
    peers = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
    a = await Replica(tmp_path, "a", fleet, pa, peers, "--config-text", PREFIX_CONFIG).start()
    b = Replica(tmp_path, "b", fleet, pb, peers, "--config-text", PREFIX_CONFIG)
    try:
        prompts = [f"shared prefix {i} " * 150 for i in range(5)]
        picked = [await route(a.stub, chat(p)) for p in prompts]
        held = [await open_request(a.stub, chat(f"long running {i}")) for i in range(4)]
        load = {k: v.requests for k, v in a.inflight.local_view().items()}
        await b.start()
        # convergence is measured from the moment b is up: its view of a's load, and a's recent prefix picks
        loop = asyncio.get_running_loop()
        up = loop.time()
        await until(lambda: {k: v.requests for k, v in b.inflight.view().items()} == load, 1.0, "b sees a's in-flight load")
        prefix_b = b.plugin("approx-prefix-cache-producer")
        prefix_a = a.plugin("approx-prefix-cache-producer")
        await until(lambda: all(prefix_b.index.size(k) == prefix_a.index.size(k) for k in set(picked)), 1.0, "a's replay at b")
        assert loop.time() - up < 1.0
        assert [await route(b.stub, chat(p + " follow-up")) for p in prompts] == picked
        for r in held:
            await r.finish()
    finally:
        await b.stop()
        await a.stop()


async def test_a_partitioned_replica_routes_on_its_own_view(pair):
    a, b = pair
    held = [await open_request(b.stub, chat(f"b's request {i}")) for i in range(2)]
    keys = {r.endpoint for r in held}
    await until(lambda: sum(requests_on(a, k) for k in keys) == 2, 1.0, "a sees b's load")
    await b.app.bus.stop()  # b loses the bus (its process keeps serving)
    b.app.bus = None
    # a's view drops b's load once b's last snapshot expires (ttl 1 s): no phantom load, ever
    await until(lambda: a.inflight.view() == {}, 2.5, "b's load expires at a")
    assert a.bus.live_peers() == []
    # b keeps routing on its own view: its own in-flight requests
    assert sum(requests_on(b, k) for k in keys) == 2
    assert await route(b.stub, chat("still routing")) in b.app.datastore.members()
    for r in held:
        await r.finish()


async def test_endpoints_unknown_here_never_get_state(tmp_path, fleet):
    extra = free_port()
    f2 = EchoFleet([extra])
    await f2.start()
    pa, pb = free_port(), free_port()
    peers = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]
    a = await Replica(tmp_path, "a", [*fleet, extra], pa, peers, "--enable-conformance-header").start()
    b = await Replica(tmp_path, "b", fleet, pb, peers).start()
    try:
        await until(lambda: a.bus.live_peers() and b.bus.live_peers(), 3.0, "connected")
        key = f"127.0.0.1:{extra}"
        held = await open_request(a.stub, chat("p" * 3000), **{"test-epp-endpoint-selection": key})
        assert held.endpoint == key
        repl = b.app.bus.replication
        await until(lambda: repl.dropped["unknown-endpoint"] >= 1, 1.0, "a's record for it dropped at b")
        await until(lambda: b.bus.ignored >= 1, 1.0, "a's load on it ignored at b")
        assert key not in b.inflight.view()
        assert key not in b.app.director.scheduler.tracked_endpoints()
        text = await b.metrics()
        assert 'pointsman_bus_records_dropped_total{reason="unknown-endpoint"}' in text
        await held.finish()
    finally:
        await a.stop()
        await b.stop()
        await f2.stop()


async def test_hostile_messages_to_a_running_replica_are_dropped_and_counted(tmp_path, fleet):
    rogue_port, bport = free_port(), free_port()
    rogue = f"127.0.0.1:{rogue_port}"
    b = await Replica(tmp_path, "b", fleet, bport, [rogue, f"127.0.0.1:{bport}"], "--bus-secret", "s3cret").start()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://{rogue}")
    key = f"127.0.0.1:{fleet[0]}"
    channel = next(c for c in b.bus.channels() if "approx-prefix" in c)
    try:
        good_load = {"ttl": 1.0, "inflight": {key: [5, 0]}}
        seq = 0

        def signed(kind, body, secret=b"s3cret"):
            nonlocal seq
            seq += 1
            return encode(BusMessage(rogue, 42, seq, kind, body), secret)

        def sign_raw(payload: bytes) -> list[bytes]:
            return [payload, hmac.new(b"s3cret", payload, hashlib.sha256).digest()]

        async def blast():
            for frames in [
                [b"\x00garbage"],  # no HMAC: auth
                sign_raw(b"\x00garbage"),  # signed garbage: malformed
                sign_raw(msgpack.packb([MAGIC, rogue, 42, 10**6, "load", {"ttl": -1, "inflight": {}}])),
                encode(BusMessage(rogue, 42, 10**6, "load", good_load)),  # unsigned
                signed("load", good_load, secret=b"wrong"),
                signed("records", {"name": "no-such-channel", "items": []}),
                signed("records", {"name": channel, "items": [["10.99.0.1:1", [1, 2]], [key, "junk"], 7]}),
            ]:
                await pub.send_multipart(frames)

        deadline = asyncio.get_running_loop().time() + 5
        while b.app.bus.replication.dropped["malformed"] < 2 or b.app.bus.replication.dropped["unknown-endpoint"] < 1:
            await blast()  # PUB/SUB joins slowly: repeat until b has heard a full round
            await asyncio.sleep(0.05)
            assert asyncio.get_running_loop().time() < deadline, (b.bus.dropped, b.app.bus.replication.dropped)
        assert b.inflight.view() == {}  # nothing unsigned, malformed or forged counted as load
        dropped = b.bus.dropped
        assert dropped["malformed"] >= 2 and dropped["auth"] >= 3 and dropped["unknown-channel"] >= 1
        text = await b.metrics()
        for line in ('pointsman_bus_messages_dropped_total{reason="auth"}',
                     'pointsman_bus_messages_dropped_total{reason="malformed"}',
                     'pointsman_bus_records_dropped_total{reason="malformed"}'):
            assert line in text, line
        assert "s3cret" not in text
        # and the replica still routes
        assert await route(b.stub, chat("after the storm"))
        # a signed, well-formed load from the rogue (a configured peer) does count: the checks are not blanket
        await pub.send_multipart(signed("load", good_load))
        await until(lambda: b.inflight.get(key).requests == 5, 1.0, "a valid signed load")
    finally:
        pub.close(0)
        ctx.term()
        await b.stop()


async def test_no_bus_without_peers_or_workers(tmp_path, fleet):
    eps = endpoints_file(tmp_path / "e.yaml", fleet)
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps)))
    await app.start()
    try:
        assert app.bus is None
    finally:
        with contextlib.suppress(Exception):
            await app.stop(0)

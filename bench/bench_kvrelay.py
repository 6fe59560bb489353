"""KV events to replicas: direct fan-in (every replica subscribes to every engine's ZMQ socket) against the NATS
relay (`epp kv-relay` per engine → one JetStream stream per pool → each replica reads the stream). Not a test.

M engines (modelsim's KV publisher with its replay socket) publish S batches each, built beforehand from
bench_kvevents' simulated engine (chains of 4-64 blocks, evictions one BlockRemoved each); R replicas follow
them. Both paths run in this one process against a real nats-server (Debian's, JetStream on, file storage), so
the relays, the broker's clients and the replicas share the cores: the numbers compare the two paths, they are
not a capacity.

1. **Live throughput**: wall time from the first batch sent until every replica has applied every batch; block
   events per second, counted once (not per replica). The engines send without pause.
2. **Catch-up of a late replica**: after the load, a new replica starts; time until its index holds every
   engine's last batch. Direct: it asks each engine's replay socket (the engines' buffers hold the whole run);
   NATS: it reads the stream (the relays are stopped by then) and contacts no engine. Reported with the replay
   requests the engines served meanwhile.

Interleaved: the direct and NATS rounds alternate `--rounds` times; medians.

    python bench/bench_kvrelay.py [--quick] [--engines M] [--replicas R] [--steps S] [--rounds N]

docs/kv-events.md ("Direct fan-in against the NATS relay") has the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from bench.bench_kvevents import BS, make_messages  # noqa: E402
from epp.fleet.kvevents.jetstream import JetStreamKVSubscriber  # noqa: E402
from epp.fleet.kvevents.relay import KVRelay  # noqa: E402
from epp.fleet.kvevents.settings import RelaySettings  # noqa: E402
from epp.fleet.kvevents.sources import KVEventsSource  # noqa: E402
from epp.fleet.kvevents.subscriber import KVEventSubscriber  # noqa: E402
from epp.natsconn import NatsTarget, connect  # noqa: E402
from epp.stack.ports import free_port  # noqa: E402
from modelsim.kvevents import KVEventPublisher  # noqa: E402
from scheduling.prefix.precise import PreciseIndex  # noqa: E402
from tests.support.nats_server import NatsServer  # noqa: E402


class Engines:
    """M publishers with replay, fed pre-built batches."""

    def __init__(self, m: int, steps: int) -> None:
        msgs, self.events = make_messages("array", m, steps * m, 4096)
        self.ports = [(free_port(), free_port()) for _ in range(m)]
        self.pubs = [KVEventPublisher(f"tcp://127.0.0.1:{p}", "kv@bench", BS, f"tcp://127.0.0.1:{r}",
                                      buffer_steps=steps + 10) for p, r in self.ports]
        for p in self.pubs:
            p._sock.setsockopt(zmq.SNDHWM, 0)
        names = sorted({ep for ep, _ in msgs})
        self.keys = names
        self.batches = [(names.index(ep), frames[2]) for ep, frames in msgs]

    def source(self, i: int) -> KVEventsSource:
        p, r = self.ports[i]
        return KVEventsSource(f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{r}")

    async def send_all(self) -> None:
        for n, (i, payload) in enumerate(self.batches):
            pub = self.pubs[i]
            pub._sock.send_multipart([pub.topic, pub.seq.to_bytes(8, "big"), payload])
            pub._retained.append((pub.seq, payload))
            pub.seq += 1
            if n % 200 == 0:
                await asyncio.sleep(0)

    def last(self) -> list[int]:
        return [p.seq - 1 for p in self.pubs]

    def close(self) -> None:
        for p in self.pubs:
            p.close()


def done(sub: Any, keys: list[str], last: list[int]) -> bool:
    st = sub.status()
    return all(k in st and st[k][0].last_seq == s for k, s in zip(keys, last, strict=True))


async def until_done(subs: list[Any], keys: list[str], last: list[int], timeout: float = 300.0) -> float:
    t0 = time.perf_counter()
    while not all(done(s, keys, last) for s in subs):
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("replicas never caught up")
        await asyncio.sleep(0.002)
    return time.perf_counter() - t0


async def direct_round(m: int, r: int, steps: int) -> tuple[float, float, int]:
    eng = Engines(m, steps)
    subs = [KVEventSubscriber(PreciseIndex(block_size=BS), catch_up_after=None, rcvhwm=0) for _ in range(r)]
    for s in subs:
        for i, k in enumerate(eng.keys):
            s.add_endpoint(k, eng.source(i))
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    await eng.send_all()
    await until_done(subs, eng.keys, eng.last())
    live = time.perf_counter() - t0
    late = KVEventSubscriber(PreciseIndex(block_size=BS), catch_up_after=0.0, replay_timeout=300.0)
    t1 = time.perf_counter()
    for i, k in enumerate(eng.keys):
        late.add_endpoint(k, eng.source(i))
    await until_done([late], eng.keys, eng.last())
    catch = time.perf_counter() - t1
    replays = sum(p.replays_served for p in eng.pubs)
    for s in [*subs, late]:
        await s.close()
    eng.close()
    return eng.events / live, catch, replays


async def nats_round(m: int, r: int, steps: int, url: str, pool: str) -> tuple[float, float, int]:
    eng = Engines(m, steps)
    ncs, relays = [], []
    for i, k in enumerate(eng.keys):
        src = eng.source(i)
        nc = await connect(NatsTarget.parse(url), name=f"bench relay {i}")
        relay = KVRelay(RelaySettings(src.endpoint, k, pool, url, engine_replay=src.replay), nc.jetstream())
        await relay.start()
        ncs.append(nc)
        relays.append(relay)
    subs = [JetStreamKVSubscriber(PreciseIndex(block_size=BS), NatsTarget.parse(url)) for _ in range(r)]
    for s in subs:
        s.follow([pool])
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    await eng.send_all()
    await until_done(subs, eng.keys, eng.last())
    live = time.perf_counter() - t0
    for relay, nc in zip(relays, ncs, strict=True):  # the late replica needs only the stream
        await relay.close()
        await nc.close()
    replays = sum(p.replays_served for p in eng.pubs)
    late = JetStreamKVSubscriber(PreciseIndex(block_size=BS), NatsTarget.parse(url))
    t1 = time.perf_counter()
    late.follow([pool])
    await until_done([late], eng.keys, eng.last())
    catch = time.perf_counter() - t1
    late_replays = sum(p.replays_served for p in eng.pubs) - replays
    for s in [*subs, late]:
        await s.close()
    eng.close()
    return eng.events / live, catch, late_replays


async def run(args: argparse.Namespace) -> None:
    server = NatsServer().start()
    out: dict[str, list[tuple[float, float, int]]] = {"direct": [], "nats": []}
    try:
        for n in range(args.rounds):
            out["direct"].append(await direct_round(args.engines, args.replicas, args.steps))
            out["nats"].append(await nats_round(args.engines, args.replicas, args.steps, server.url, f"bench{n}"))
    finally:
        server.stop()
    print(f"## KV events to {args.replicas} replicas from {args.engines} engines, {args.steps:,} batches each "
          f"(medians of {args.rounds} interleaved rounds)\n")
    print("| path | live: block events/s (all replicas applied) | late replica catch-up (ms) "
          "| engine replays the late replica asked |")
    print("|---|---|---|---|")
    for path, rows in out.items():
        rate = statistics.median(x[0] for x in rows)
        catch = statistics.median(x[1] for x in rows)
        replays = max(x[2] for x in rows)
        print(f"| {path} | {rate:,.0f} | {catch * 1000:,.0f} | {replays} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 engines, 2 replicas, 500 batches, 1 round")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=800,
                    help="batches per engine (800: with 1,000 the direct late replica's catch-up replay sometimes did "
                         "not complete on a loaded machine; docs/kv-events.md)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.quick:
        args.engines, args.replicas, args.steps, args.rounds = 2, 2, 500, 1
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

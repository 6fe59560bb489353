"""The replica bus at scale: CPU and messages per replica against the replica count, over the ZMQ mesh and NATS.

Each replica is a process running the real bus (epp.bus.ReplicaBus) with a simulated router in front: a fixed
cluster-wide decision rate split over the replicas (each of N replicas decides QPS/N per second), every decision
holds one request on one of E endpoints for a random 0.5 to 2 s (its in-flight count goes into the load
snapshots) and exports one record of 128 block hashes (as the prefix producer does for a 2,000-token prompt); each replica keeps its last
1,024 records as the snapshot replayed to replicas that join. Over NATS a nats-server is started here.

Per replica it reports CPU (user + system, all threads: ZMQ's I/O thread included) as a share of a core, messages
published and received per second, and bytes sent and received per second; for NATS also the broker's CPU. The
last replica starts late and reports its catch-up time: from its start until it has every peer's load and at
least 1,024 records from each (the replays; live records alone would take minutes).

    .venv/bin/python bench/bench_bus_scale.py --replicas 2,4,8 --transports mesh,nats --duration 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUBJECT = "pointsman.bus.bench.pool"
SNAPSHOT = 1024


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class SimReplica:
    """One replica's bus with a simulated router in front (decisions, holds, prefix records) and its counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        from epp.bus import ReplicaBus
        from epp.bus.nats_transport import NatsTransport
        from epp.fleet.datastore import InflightTracker
        from epp.natsconn import NatsTarget
        from scheduling.prefix.index import PrefixIndex

        if args.transport == "nats":
            import nats  # noqa: F401 - at process start, as `epp serve` has it by the time its bus starts
        self.args = args
        self.name = f"127.0.0.1:{args.base_port + args.index}"
        self.peers = [f"127.0.0.1:{args.base_port + i}" for i in range(args.n)]
        transport = (NatsTransport(NatsTarget.parse(args.url), SUBJECT, name=self.name, signed=False)
                     if args.transport == "nats" else None)
        self.bus = bus = ReplicaBus(self.name, InflightTracker(), peers=self.peers, transport=transport)
        self.endpoints = [f"10.0.0.{i}:8000" for i in range(args.endpoints)]
        self.rng = random.Random(args.index)
        self.index = PrefixIndex()  # peers' records are applied here, as the prefix producer does
        self.outbox: list[list[object]] = []
        self.recent = [self.record() for _ in range(SNAPSHOT)]  # a full snapshot, as after a while of routing
        self.got: Counter[str] = Counter()
        self.io: Counter[str] = Counter()
        bus.add_channel("prefix", self.take, self.apply, snapshot=lambda: list(self.recent))
        self._send, self._receive = bus.transport.send, bus.receiver.receive
        bus.transport.send = self.counted_send  # type: ignore[method-assign]
        bus.receiver.receive = self.counted_receive  # type: ignore[method-assign]

    def record(self) -> list[object]:
        return [self.rng.choice(self.endpoints), [self.rng.getrandbits(62) for _ in range(self.args.hashes)]]

    def take(self) -> list[list[object]]:
        out, self.outbox = self.outbox, []
        self.recent = (self.recent + out)[-SNAPSHOT:]
        return out

    def apply(self, peer: str, items: list[list[object]]) -> None:
        self.got[peer] += len(items)
        for key, hashes in items:
            self.index.record(str(key), hashes, time.monotonic())  # type: ignore[arg-type]

    def counted_send(self, frames: list[bytes], to: str | None = None) -> bool:
        self.io["sent_bytes"] += sum(len(f) for f in frames)
        return self._send(frames, to)

    def counted_receive(self, frames: list[bytes]) -> None:
        self.io["received_bytes"] += sum(len(f) for f in frames)
        self._receive(frames)

    def caught_up(self) -> bool:
        return len(self.bus.live_peers()) == self.args.n - 1 and all(
            self.got[p] >= SNAPSHOT for p in self.peers if p != self.name)

    def counters(self) -> tuple[float, int, int, int, int]:
        bus = self.bus
        return (cpu_seconds(), bus.published, sum(bus.received.values()), self.io["sent_bytes"],
                self.io["received_bytes"])

    async def run(self) -> dict[str, float]:
        args, bus, rng = self.args, self.bus, self.rng
        t_start = time.monotonic()
        await bus.start()
        loop = asyncio.get_running_loop()
        catchup, before, measured = -1.0, None, t_start
        while (now := time.monotonic()) < t_start + args.duration:
            if before is None and now >= t_start + args.warmup:
                before, measured = self.counters(), now
            if catchup < 0 and self.caught_up():
                catchup = now - t_start
            await asyncio.sleep(rng.expovariate(args.qps / args.n))
            rec = self.record()
            token = bus.inflight.add(str(rec[0]), 2200)
            loop.call_later(rng.uniform(0.5, 2.0), bus.inflight.remove, token)
            self.outbox.append(rec)
            bus.notify()
        if before is None:  # starved past the warm-up (a loaded machine): measure from the start
            before, measured = (0.0, 0, 0, 0, 0), t_start
        span = time.monotonic() - measured
        rates = [(b - a) / span for a, b in zip(before, self.counters(), strict=True)]
        await bus.stop()
        return dict(zip(("cpu", "published", "received", "sent_bytes", "received_bytes"), rates, strict=True),
                    dropped=sum(bus.dropped.values()), catchup=catchup, reasons=dict(bus.dropped),
                    got=min((self.got[p] for p in self.peers if p != self.name), default=0))


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_point(transport: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    from epp.stack import nats_binary
    from epp.stack.ports import free_port, free_port_block, wait_port

    base = free_port_block(n)
    broker = None
    url = ""
    if transport == "nats":
        port = free_port()
        broker = subprocess.Popen([nats_binary(), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_port(port, proc=broker, what="nats-server")
        url = f"nats://127.0.0.1:{port}"
    common = [sys.executable, __file__, "--child", "--transport", transport, "--n", str(n), "--base-port", str(base),
              "--qps", str(args.qps), "--endpoints", str(args.endpoints), "--hashes", str(args.hashes), "--url", url]
    procs = []
    broker_cpu0 = proc_cpu(broker.pid) if broker else 0.0
    t0 = time.monotonic()
    for i in range(n):
        late = i == n - 1
        if late:
            time.sleep(args.warmup)  # the others are busy: the last one joins them
        duration = args.duration if not late else args.duration - args.warmup
        procs.append(subprocess.Popen([*common, "--index", str(i), "--duration", str(duration),
                                       "--warmup", str(args.warmup if not late else 1.0),
                                       *(["--late"] if late else [])], stdout=subprocess.PIPE, text=True))
    results = [json.loads(p.communicate(timeout=args.duration + 60)[0].strip().splitlines()[-1]) for p in procs]
    if os.environ.get("BUS_BENCH_DEBUG"):
        print(results, file=sys.stderr)
    wall = time.monotonic() - t0
    out = {k: sum(r[k] for r in results) / n for k in ("cpu", "published", "received", "sent_bytes",
                                                         "received_bytes")}
    out["dropped"] = sum(r["dropped"] for r in results)
    out["wire_out"] = out["published"] * ((n - 1) if transport == "mesh" else 1)  # the mesh sends to every peer
    out["catchup"] = results[-1]["catchup"]
    if broker is not None:
        out["broker_cpu"] = (proc_cpu(broker.pid) - broker_cpu0) / wall
        broker.terminate()
        broker.wait(10)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="2,4,8", help="replica counts (2,4,8)")
    ap.add_argument("--transports", default="mesh,nats", help="mesh, nats or both")
    ap.add_argument("--qps", type=float, default=100.0, help="cluster-wide decisions per second (100)")
    ap.add_argument("--endpoints", type=int, default=16, help="simulated engines (16)")
    ap.add_argument("--hashes", type=int, default=128,
                    help="block hashes per record (128: a 2,000-token prompt in 16-token blocks)")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per point (8)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring; the last replica joins then")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--transport", "--url"):
        ap.add_argument(flag, default="", help=argparse.SUPPRESS)
    for flag in ("--n", "--index", "--base-port"):
        ap.add_argument(flag, type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--late", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(SimReplica(args).run())), flush=True)
        return 0
    tempfile.tempdir = tempfile.mkdtemp(prefix="pointsman-busbench-")
    print(f"{args.qps:g} decisions/s over the cluster, {args.endpoints} endpoints, {args.duration:g} s per point")
    print("| transport | replicas | CPU per replica (% core) | msgs/s published per replica | msgs/s sent on the wire "
          "per replica | msgs/s received per replica | KB/s published per replica | KB/s received per replica | "
          "broker CPU (% core) | catch-up s | dropped |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.replicas.split(",")):
        for transport in args.transports.split(","):
            r = run_point(transport, n, args)
            broker = f"{100 * r['broker_cpu']:.1f}" if "broker_cpu" in r else "-"
            print(f"| {transport} | {n} | {100 * r['cpu']:.1f} | {r['published']:.0f} | {r['wire_out']:.0f} | "
                  f"{r['received']:.0f} | "
                  f"{r['sent_bytes'] / 1000:.1f} | {r['received_bytes'] / 1000:.1f} | {broker} | "
                  f"{r['catchup']:.2f} | {r['dropped']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

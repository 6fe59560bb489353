"""Scaling: the EPP alone, driven by an ext_proc load generator, with 1 and 2 worker processes (`epp serve --workers`).

No Envoy: a load generator opens ext_proc streams shaped as Envoy's (request headers with the FULL_DUPLEX_STREAMED
protocol config, then the body with end_of_stream; the EPP answers with its pick), over many connections (so
SO_REUSEPORT spreads them over the workers). Two generators:
- `h2load` (default; Debian's nghttp2-client, C): every stream carries the two gRPC messages and closes its side,
  as Envoy does for a request without response phases; cheap enough to leave the cores to the EPP;
- `python`: grpc.aio processes that hold each stream open until the pick arrives and then end it, exactly Envoy's
  sequence in the lean phases; it costs about as much CPU per stream as the EPP itself.
Every configuration is measured in interleaved rounds, each started afresh for its turn and stopped after it (an
idle EPP still scrapes its endpoints every 50 ms: left running, it would steal CPU from the one measured). The
table gives median streams per second, the EPP group's CPU time per stream, and the load generator's CPU per stream
(on a small machine it competes with the EPP for the same cores).

    .venv/bin/python bench/bench_scaling.py --workers 1,2 --rounds 3 --duration 5
    .venv/bin/python bench/bench_scaling.py --workers 1,2 --procs 2 --streams 32 --connections 8

The endpoints are Envoy direct_response listeners (as bench_extproc's backends), four of them; the scheduler is the
built-in default profile. Measured on this machine's cores: see docs/replicas.md for the table and what limits it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from extproc_stack import Procs, backend_config, bin_path, cpu_seconds  # noqa: E402
from streams_frames import request_messages  # noqa: E402

from epp.stack.ports import free_port, wait_port  # noqa: E402


def _generator(port: int, streams: int, connections: int, duration: float, warmup: float,
               out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One load-generator process: `streams` concurrent request loops over `connections` gRPC connections."""
    import grpc
    import orjson
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from epp.protocol import BodyMode
    from tests.support.extproc import body_msg, headers_msg

    async def main() -> tuple[int, int, float]:
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(connections)]
        stubs = [pb_grpc.ExternalProcessorStub(ch) for ch in channels]
        loop = asyncio.get_running_loop()
        start = loop.time() + warmup
        end = start + duration
        done = errors = 0

        async def one(i: int) -> None:
            nonlocal done, errors
            stub = stubs[i % len(stubs)]
            n = 0
            while loop.time() < end:
                n += 1
                body = orjson.dumps({"model": "meta-llama/Llama-3.1-8B", "messages": [
                    {"role": "user", "content": f"What is the capital of France? ({i}.{n % 64})"}]})
                call = stub.Process()
                try:
                    await call.write(headers_msg(mode=BodyMode.FULL_DUPLEX_STREAMED))
                    await call.write(body_msg(body, True))
                    picked = False
                    while not picked:
                        resp = await call.read()
                        if resp is grpc.aio.EOF or resp.HasField("immediate_response"):
                            raise RuntimeError("no pick")
                        picked = resp.HasField("request_body")
                    await call.done_writing()
                    while await call.read() is not grpc.aio.EOF:
                        pass
                    if start <= loop.time() < end:
                        done += 1
                except (grpc.RpcError, RuntimeError):
                    if start <= loop.time() < end:
                        errors += 1

        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(streams)))
        for ch in channels:
            await ch.close()
        return done, errors, time.process_time() - cpu0

    out.put(asyncio.run(main()))


def measure_h2load(port: int, epp_pid: int, connections: int, streams: int, duration: float,
                   body: Path) -> dict[str, float]:
    import re
    import resource

    url = f"http://127.0.0.1:{port}/envoy.service.ext_proc.v3.ExternalProcessor/Process"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = cpu_seconds(epp_pid)
    run = subprocess.run(["h2load", "-c", str(connections), "-m", str(streams), "-D", str(int(duration)),
                          "--warm-up-time", "1", "-d", str(body), "-H", "content-type: application/grpc",
                          "-H", "te: trailers", url], capture_output=True, text=True, timeout=duration + 60)
    cpu1 = cpu_seconds(epp_pid)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", run.stdout)
    if not done:
        raise RuntimeError(f"h2load failed: {run.stdout[-500:]} {run.stderr[-500:]}")
    ok, failed = int(done.group(2)), int(done.group(3))
    gen = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # h2load's own window is duration s (after its warm-up); the EPP's CPU covers warm-up too: scale it
    return {"rps": ok / duration, "errors": failed, "epp_cpu_us": (cpu1 - cpu0) / max(ok, 1) * 1e6
            * duration / (duration + 1.0), "gen_cpu_us": gen / max(ok, 1) * 1e6}


def measure(port: int, epp_pid: int, procs: int, streams: int, connections: int, duration: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    warmup = 1.0
    gens = [ctx.Process(target=_generator, args=(port, streams, connections, duration, warmup, q))
            for _ in range(procs)]
    for g in gens:
        g.start()
    time.sleep(warmup + 0.5)  # the processes start (spawn) and warm up; then the window opens
    cpu0 = cpu_seconds(epp_pid)
    t0 = time.monotonic()
    results = [q.get(timeout=duration + 120) for _ in gens]
    cpu1 = cpu_seconds(epp_pid)
    window = min(duration, time.monotonic() - t0)
    for g in gens:
        g.join(30)
    done = sum(r[0] for r in results)
    return {"rps": done / duration, "errors": sum(r[1] for r in results),
            "epp_cpu_us": (cpu1 - cpu0) * (duration / max(window, 1e-9)) / max(done, 1) * 1e6,
            "gen_cpu_us": sum(r[2] for r in results) / max(done, 1) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="comma list of worker counts (1,2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per round and configuration")
    ap.add_argument("--procs", type=int, default=2, help="load-generator processes (2)")
    ap.add_argument("--streams", type=int, default=32, help="concurrent streams per generator process (32)")
    ap.add_argument("--connections", type=int, default=8, help="gRPC connections per generator process (8)")
    ap.add_argument("--epp-args", default="", help="extra flags for `epp serve`")
    ap.add_argument("--generator", choices=("h2load", "python"), default="h2load",
                    help="h2load (C; default) or python (grpc.aio processes, Envoy's exact stream sequence)")
    args = ap.parse_args()
    if args.generator == "h2load" and not shutil.which("h2load"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "nghttp2-client"], check=False)
    procs = Procs()
    body = procs.dir / "grpc-body.bin"
    body.write_bytes(request_messages())
    try:
        backends = [free_port() for _ in range(4)]
        procs.envoy("backend", backend_config(backends, free_port()), backends[-1])
        eps = Path(tempfile.mkdtemp(prefix="bench-scaling-")) / "endpoints.yaml"
        eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
            {"address": "127.0.0.1", "port": p} for p in backends]}]}))
        counts = [int(x) for x in args.workers.split(",")]
        rows: dict[int, list[dict[str, float]]] = {w: [] for w in counts}
        for r in range(args.rounds):
            for w in counts:
                port = free_port()
                cmd = [bin_path("epp"), "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-port", str(port),
                       "--grpc-health-port", "0", "--metrics-port", str(free_port()), "--endpoints-file", str(eps),
                       "-v", "0", *args.epp_args.split()]
                if w > 1:
                    cmd += ["--workers", str(w)]
                proc = procs.spawn(f"epp-{w}-{r}", cmd, port)
                wait_port(port)
                time.sleep(1.5)  # every worker up (the port answers as soon as the first one is)
                if args.generator == "h2load":
                    got = measure_h2load(port, proc.pid, args.procs * args.connections,
                                         max(1, args.streams // args.connections), args.duration, body)
                else:
                    got = measure(port, proc.pid, args.procs, args.streams, args.connections, args.duration)
                proc.terminate()
                proc.wait(30)
                rows[w].append(got)
                print(f"round {r + 1} workers={w}: {got['rps']:.0f} streams/s, EPP {got['epp_cpu_us']:.0f} µs "
                      f"CPU/stream, generator {got['gen_cpu_us']:.0f} µs, errors {got['errors']:.0f}", flush=True)
        print(f"\n{args.rounds} interleaved rounds x {args.duration:g}s, medians; generator {args.generator}: "
              f"{args.procs * args.streams} concurrent streams over {args.procs * args.connections} connections; "
              f"{os.cpu_count()} CPUs\n")
        print("| workers | streams/s | vs 1 worker | EPP CPU µs/stream | generator CPU µs/stream | errors |")
        print("|---|---|---|---|---|---|")
        base = statistics.median(x["rps"] for x in rows[min(rows)])
        for w, rs in rows.items():
            rps = statistics.median(x["rps"] for x in rs)
            print(f"| {w} | {rps:.0f} | {rps / base:.2f}x | {statistics.median(x['epp_cpu_us'] for x in rs):.0f} | "
                  f"{statistics.median(x['gen_cpu_us'] for x in rs):.0f} | {sum(x['errors'] for x in rs):.0f} |")
    finally:
        procs.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

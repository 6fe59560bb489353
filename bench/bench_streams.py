"""Long-lived streams: the EPP's CPU per request with 16 and with 2000 ext_proc streams held open, in one run.

With lean response phases Envoy keeps a request's ext_proc stream open for as long as the LLM response lasts
(seconds to minutes), so at a given request rate the number of open streams grows with response time. Work that
is O(open streams) per frame or per new stream (h2's stream counting, walks over every stream) shows up here as
CPU per request growing with the streams held; the target is per-request CPU within 10% between 16 and 2000.

The load is Envoy's lean sequence, from a raw HTTP/2 client in this process (cheap: it builds frames itself): each
request opens a stream, sends the request headers and the whole body (two gRPC messages, FULL_DUPLEX_STREAMED)
without ending the stream, holds it open for `streams / rate` seconds (the "response"), then half-closes it. New
requests start at `rate` per second whatever ends (as independent clients would), so the streams held are
rate x hold = `streams`, and the frames reach the EPP in the same pattern at every count: "EPP wake-ups/req" (its
voluntary context switches per request) shows it, since every wake-up costs the EPP the same whatever it brings.
Header blocks are the same bytes on every stream, as Envoy's are. The EPP runs alone (endpoints never scraped),
started afresh for every measurement; candidates and stream counts are interleaved over rounds and medians are
printed.

    .venv/bin/python bench/bench_streams.py --rounds 3 --rate 400 --streams 16,2000
    .venv/bin/python bench/bench_streams.py --candidate 'before::PYTHONPATH=/path/to/other/checkout'
    .venv/bin/python bench/bench_streams.py --candidate 'transport alone::toy'   # bench/toy_extproc.py --h2
    .venv/bin/python bench/bench_streams.py --transport-only --rounds 5          # the HTTP/2 layer, in process
    .venv/bin/python bench/bench_streams.py --in-process --rounds 5 \
        --candidate 'before::PYTHONPATH=/path/to/other/checkout' --candidate 'after::'   # the whole EPP, no sockets

`--in-process` runs `epp serve`'s whole application (director, scheduler, passive health, metrics) in a child
process per measurement, fed by its HTTP/2 connections directly (four of them, each with a transport that drops
what it is given): what the EPP does per request with the streams held, without the sockets, the event loop's
wake-ups and the machine's other load that dominate the end-to-end figure's noise. Its clock runs faster than
the load's (the same request count goes through in a second or two), and GC runs as it would.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# This checkout's modules, behind PYTHONPATH's: an --in-process child with a candidate's `PYTHONPATH=/other/checkout`
# runs that checkout's EPP.
_AFTER_PYTHONPATH = 1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
sys.path.insert(_AFTER_PYTHONPATH, str(ROOT))
sys.path.insert(_AFTER_PYTHONPATH, str(ROOT / "bench"))

from extproc_stack import Procs, bin_path, cpu_seconds  # noqa: E402
from streams_frames import (  # noqa: E402
    PREFACE,
    SERVE_FLAGS,
    frame,
    header_block,
    in_process,
    request_messages,
    transport_only,
)

from epp.stack.ports import free_port  # noqa: E402


class Client:
    """One connection holding its share of the streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.sid = -1
        self.window = 65535  # the server's connection window for what we send
        self.open: collections.deque[tuple[float, int]] = collections.deque()  # (half-close at, stream)
        self.completed = self.errors = 0

    async def read(self) -> None:
        buf = b""
        while chunk := await self.reader.read(1 << 16):
            buf += chunk
            pos = 0
            while len(buf) - pos >= 9:
                hi, lo, ftype, flags, sid = struct.unpack_from(">HBBBI", buf, pos)
                length = hi << 8 | lo
                if pos + 9 + length > len(buf):
                    break
                if ftype == 8 and sid == 0:
                    self.window += int.from_bytes(buf[pos + 9: pos + 13], "big")
                elif ftype == 1 and flags & 1:
                    self.completed += 1
                elif ftype in (3, 7):  # RST_STREAM, GOAWAY
                    self.errors += 1
                pos += 9 + length
            buf = buf[pos:]


async def generate(port: int, streams: int, rate: float, connections: int, warmup: float, duration: float,
                   epp_pid: int) -> dict[str, float]:
    hold = streams / rate
    block, messages = header_block(), request_messages()
    clients = []
    for _ in range(connections):
        c = Client(*await asyncio.open_connection("127.0.0.1", port))
        c.writer.write(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
                       + frame(8, 0, 0, struct.pack(">I", 1 << 30)))
        clients.append(c)
    readers = [asyncio.ensure_future(c.read()) for c in clients]
    # Headroom over the streams held (rate x hold): a cap that binds would make each new request wait for a
    # stream to end and go out with that stream's half-close, and with few streams the whole load would fall into
    # lockstep (bursts that the EPP takes in one wake-up, which makes few streams look cheaper than they are).
    per_conn = streams // connections + max(2, streams // connections // 10)
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    tokens = 0.0  # new requests start at `rate` per second (a burst would end in a burst: no steady state)
    turn = 0
    marks: dict[str, tuple[float, float, int, int, float, int]] = {}
    try:
        while True:
            now = loop.time()
            tokens = min(tokens + (now - last) * rate, rate)
            last = now
            if "start" not in marks and now >= start + warmup:
                marks["start"] = (now, cpu_seconds(epp_pid), sum(c.completed for c in clients),
                                  sum(c.errors for c in clients), time.process_time(), wakeups(epp_pid))
            if now >= start + warmup + duration:
                marks["end"] = (now, cpu_seconds(epp_pid), sum(c.completed for c in clients),
                                sum(c.errors for c in clients), time.process_time(), wakeups(epp_pid))
                break
            outs: dict[Client, list[bytes]] = {c: [] for c in clients}
            for c in clients:
                while c.open and c.open[0][0] <= now:
                    outs[c].append(frame(0, 1, c.open.popleft()[1], b""))
            while tokens >= 1:  # new requests, spread over the connections in turn
                ready = [c for c in clients if len(c.open) < per_conn and c.window >= len(messages)]
                if not ready:
                    break
                c = ready[turn % len(ready)]
                turn += 1
                tokens -= 1
                c.sid += 2
                c.window -= len(messages)
                outs[c].append(frame(1, 4, c.sid, block) + frame(0, 0, c.sid, messages))
                c.open.append((now + hold, c.sid))
            for c, out in outs.items():
                if out:
                    c.writer.write(b"".join(out))
            await asyncio.sleep(0.002)
    finally:
        for c in clients:
            c.writer.close()
        for r in readers:
            r.cancel()
    (t0, cpu0, done0, err0, gen0, wake0), (t1, cpu1, done1, err1, gen1, wake1) = marks["start"], marks["end"]
    done = max(done1 - done0, 1)
    return {"rps": done / (t1 - t0), "epp_cpu_us": (cpu1 - cpu0) / done * 1e6, "gen_cpu_us": (gen1 - gen0) / done * 1e6,
            "errors": err1 - err0, "open": streams, "wakeups": (wake1 - wake0) / done}


def wakeups(pid: int) -> int:
    """The process's voluntary context switches (its main thread's sleeps in epoll, mostly): how many wake-ups
    the load cost it. Each costs the same whatever it brings, so a load that batches differently costs differently."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def parse_candidate(text: str) -> tuple[str, dict[str, str], list[str]]:
    label, _, rest = text.partition("::")
    env, flags = {}, []
    for word in rest.split():
        if "=" in word and not word.startswith("-") and not flags:
            k, v = word.split("=", 1)
            env[k] = v
        else:
            flags.append(word)
    return label or "Pointsman", env, flags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="16,2000", help="comma list of streams held open (16,2000)")
    ap.add_argument("--rate", type=float, default=400.0, help="requests per second, the same for every count (400)")
    ap.add_argument("--connections", type=int, default=4, help="HTTP/2 connections the streams share (4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured, after the streams are all open")
    ap.add_argument("--candidate", action="append",
                    help="'LABEL::[ENV=value ...] [epp serve flags]' (repeatable; default: this checkout)")
    ap.add_argument("--transport-only", action="store_true",
                    help="measure this checkout's HTTP/2 connection alone, in process (no sockets, no routing)")
    ap.add_argument("--in-process", action="store_true",
                    help="measure each candidate's whole EPP in a child process, fed without sockets (see above)")
    ap.add_argument("--requests", type=int, default=20000, help="requests per --in-process measurement (20000)")
    ap.add_argument("--in-process-child", nargs=2, metavar=("STREAMS", "ENDPOINTS_FILE"), help=argparse.SUPPRESS)
    args, extra = ap.parse_known_args()
    if args.in_process_child:  # one --in-process measurement: print µs/req
        n, eps_file = int(args.in_process_child[0]), args.in_process_child[1]
        print(asyncio.run(in_process(n, args.requests, eps_file, extra)))
        return 0
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    counts = [int(x) for x in args.streams.split(",")]
    if args.transport_only:
        got: dict[int, list[float]] = collections.defaultdict(list)
        for _ in range(args.rounds):
            for n in counts:
                got[n].append(asyncio.run(transport_only(n, 20000)))
        print("| streams open | transport CPU µs/req (median) | vs fewest streams |\n|---|---|---|")
        base = statistics.median(got[counts[0]])
        for n in counts:
            print(f"| {n} | {statistics.median(got[n]):.1f} | {statistics.median(got[n]) / base:.2f}x |")
        return 0
    candidates = [parse_candidate(c) for c in (args.candidate or ["Pointsman::"])]
    procs = Procs()
    eps = Path(tempfile.mkdtemp(prefix="bench-streams-")) / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
        {"address": "127.0.0.1", "port": p} for p in (9, 19, 29, 39)]}]}))
    rows: dict[tuple[str, int], list[dict[str, float]]] = collections.defaultdict(list)
    if args.in_process:
        if any(flags[:1] == ["toy"] for _, _, flags in candidates):
            ap.error("--in-process measures the EPP: no toy candidate")
        return in_process_runs(args, counts, candidates, eps)
    try:
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                for label, env, flags in candidates:
                    port = free_port()
                    if flags[:1] == ["toy"]:  # the do-nothing processor on the h2 transport: the transport alone
                        cmd = [sys.executable, str(ROOT / "bench" / "toy_extproc.py"), "--h2", "--port", str(port),
                               "--backend", "127.0.0.1:9", *flags[1:]]
                    else:
                        cmd = [bin_path("epp"), "serve", *SERVE_FLAGS, "--grpc-port", str(port), "--endpoints-file",
                               str(eps), *flags]
                    proc = procs.spawn(f"epp-{r}-{n}-{label}", cmd, port, env=env)
                    got = asyncio.run(generate(port, n, args.rate, args.connections, n / args.rate + 1.0,
                                               args.duration, proc.pid))
                    proc.terminate()
                    proc.wait(30)
                    rows[(label, n)].append(got)
                    print(f"round {r + 1}: {label}, {n} streams: {got['rps']:.0f} req/s, EPP {got['epp_cpu_us']:.0f} "
                          f"µs/req, {got['wakeups']:.2f} wake-ups/req, generator {got['gen_cpu_us']:.0f} µs/req, errors {got['errors']:.0f}",
                          file=sys.stderr, flush=True)
    finally:
        procs.stop()
    print(f"\n{args.rounds} interleaved rounds x {args.duration:g}s, medians; {args.rate:g} requests/s, each held open "
          f"for streams/rate seconds, over {args.connections} connections; {os.cpu_count()} CPUs\n")
    print("| candidate | streams open | req/s | EPP CPU µs/req | vs fewest streams | EPP wake-ups/req "
          "| generator CPU µs/req | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for label, _, _ in candidates:
        base = statistics.median(x["epp_cpu_us"] for x in rows[(label, counts[0])])
        for n in counts:
            rs = rows[(label, n)]
            cpu = statistics.median(x["epp_cpu_us"] for x in rs)
            print(f"| {label} | {n} | {statistics.median(x['rps'] for x in rs):.0f} | {cpu:.0f} | {cpu / base:.2f}x | "
                  f"{statistics.median(x['wakeups'] for x in rs):.2f} | "
                  f"{statistics.median(x['gen_cpu_us'] for x in rs):.0f} | {sum(x['errors'] for x in rs):.0f} |")
    return 0


def in_process_runs(args: argparse.Namespace, counts: list[int], candidates: list[tuple[str, dict[str, str], list[str]]],
                    eps: Path) -> int:
    import subprocess

    got: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for r in range(args.rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            for label, env, flags in candidates:
                out = subprocess.run([sys.executable, __file__, "--requests", str(args.requests), "--in-process-child",
                                      str(n), str(eps), *flags], env={**os.environ, **env}, check=True,
                                     capture_output=True, text=True)
                got[(label, n)].append(float(out.stdout.split()[-1]))
                print(f"round {r + 1}: {label}, {n} streams: {got[(label, n)][-1]:.0f} µs/req", file=sys.stderr,
                      flush=True)
    print(f"\n{args.rounds} interleaved rounds x {args.requests} requests, medians; the whole EPP in a child process, "
          f"fed over {4} HTTP/2 connections without sockets; {os.cpu_count()} CPUs\n")
    print("| candidate | streams open | EPP CPU µs/req (median) | vs fewest streams | min-max |\n|---|---|---|---|---|")
    for label, _, _ in candidates:
        base = statistics.median(got[(label, counts[0])])
        for n in counts:
            xs = got[(label, n)]
            print(f"| {label} | {n} | {statistics.median(xs):.0f} | {statistics.median(xs) / base:.2f}x | "
                  f"{min(xs):.0f}-{max(xs):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

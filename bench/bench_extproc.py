"""Proxy-path benchmark: Envoy direct, vllm-router, the do-nothing ext_proc floor and Pointsman, interleaved.

Every path ends at the same keep-alive backend (an Envoy with four direct_response listeners, see
bench/extproc_stack.py) and gets the same chat body of `--body-bytes` bytes from wrk. Within a round every path is
measured once, in a rotating order; medians over rounds are printed as one markdown table:

- req/s and p50 latency at each connection count, and the ratios against vllm-router and against the floor;
- processor CPU µs per request (Pointsman, the toy floor, or the whole vllm-router), from /proc utime+stime;
- front-Envoy CPU µs per request (the Envoy in front of the processor; for "Envoy direct" the proxy itself);
- upstream connections opened per 1000 requests (from the backend's downstream_cx_total): ~0 when connections
  are reused, ~1000 when every request dials a new one;
- the p50 latency each path adds to Envoy direct's at the same size and connection count.

Long prompts (issue 22): `--body-bytes 120,16384,65536,262144,1048576 --conns 1,16 --floor h2 --no-peer` with a
candidate per request body mode. The bodies name their model first; `--model-last` puts it after the prompt, where
OpenAI's Python client writes it (such a body cannot be decided before it ends: it is decided on its head at its
end, docs/protocol.md).

With more than one body size a second table gives issue 32's ratios: how much each processor's CPU per request
grows from the smallest body to each larger one, against its own front Envoy's growth, against the median front
Envoy growth of every path in its request body mode (pooled: they do the same work, and differ by noise), and
against the do-nothing floor's in the same mode (`--floor h2 --floor h2-buffered` gives a floor per mode):

    .venv/bin/python bench/bench_extproc.py --rounds 5 --duration 4 --body-bytes 120,16384,262144 --no-peer \
      --floor h2 --floor h2-buffered --candidate 'FULL_DUPLEX::' --candidate 'BUFFERED:original-dst+BUFFERED:'

Pointsman candidates are `--candidate 'LABEL:VARIANT:FLAGS'` (VARIANT is original-dst, override-host or empty for
`--variant`, with `+MODE` for the front Envoy's request body mode, e.g. `original-dst+BUFFERED`; FLAGS go to `epp serve`, `{port}` in them becomes a free port; an `ENV=value` word before the flags
sets an environment variable, e.g. `PYTHONPATH=/tmp/before` runs another checkout of Pointsman; `{otlp}` becomes the
address of a do-nothing OTLP/gRPC collector, bench/otlp_sink.py, started for the run). The
default candidate is Pointsman with no extra flags. A candidate with `--workers N` gets a front Envoy that spreads
its streams over the N workers, and its CPU is the whole process group's. Floors are bench/toy_extproc.py variants (`--floor gen --floor aio`).

    .venv/bin/python bench/bench_extproc.py --rounds 5 --duration 5 --body-bytes 109
    .venv/bin/python bench/bench_extproc.py --candidate 'asyncio::--event-loop asyncio' --floor gen --floor gen-uvloop

Needs wrk (Debian package `wrk`; installed with apt-get when missing) and, for the peer, `pip install vllm-router`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extproc_stack import (  # noqa: E402
    ROOT,
    Procs,
    backend_config,
    backend_connections,
    bin_path,
    chat_body,
    cpu_seconds,
    direct_config,
    front_config,
    wrk_script,
)

from epp.stack.ports import free_port  # noqa: E402

FLOORS = {"gen": [], "aio": ["--read-write"], "sync": ["--sync"], "gen-uvloop": ["--uvloop"],
          "aio-uvloop": ["--read-write", "--uvloop"], "grpclib": ["--grpclib"],
          "grpclib-uvloop": ["--grpclib", "--uvloop"], "h2": ["--h2"], "h2-uvloop": ["--h2", "--uvloop"],
          "h2-buffered": ["--h2", "--buffered"]}


@dataclass
class Path_:
    name: str
    url: str
    kind: str  # direct | router | floor | pointsman
    mode: str = "FULL_DUPLEX_STREAMED"  # the front Envoy's request body mode
    processor: subprocess.Popen | None = None
    front: subprocess.Popen | None = None
    rows: dict[tuple[int, int], list[tuple[float, float, float, float, float]]] = field(default_factory=dict)
    errors: int = 0


def wrk(url: str, conns: int, duration: float, script: Path) -> tuple[float, float, int, int]:
    """(req/s, p50 ms, requests, socket errors and timeouts); a non-2xx answer is an error of the path."""
    run = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s", "--timeout", "5s", "--latency", "-s",
                          str(script), url], capture_output=True, text=True, timeout=duration + 30)
    out = run.stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found:
        raise RuntimeError(f"wrk against {url} failed: {out} {run.stderr}")
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
    total = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise RuntimeError(f"{url}: {bad.group(0)}")
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return float(found.group(1)), float(m.group(1)) * scale, total, sum(map(int, errors.groups())) if errors else 0


def parse_candidate(text: str, default_variant: str) -> tuple[str, str, list[str], dict[str, str]]:
    label, variant, flags = (text.split(":", 2) + ["", ""])[:3]
    env: dict[str, str] = {}
    words = flags.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return label.strip() or "Pointsman", variant.strip() or default_variant, words, env


def floors(specs: list[str] | None) -> list[tuple[str, list[str], dict[str, str]]]:
    """`--floor NAME` (a FLOORS key) or `--floor 'LABEL=[ENV=value ...] toy flags'`."""
    out = []
    for spec in specs or ["gen"]:
        if spec in FLOORS:
            out.append((spec, FLOORS[spec], {}))
            continue
        label, _, rest = spec.partition("=")
        _, _, words, env = parse_candidate(f"{label}::{rest}", "")
        out.append((label, words, env))
    return out


def start(args: argparse.Namespace, procs: Procs, script: Path) -> tuple[list[Path_], int]:
    """Start the backend and every path; `script` is used to warm them up."""
    backends = [free_port() for _ in range(4)]
    backend_admin = free_port()
    procs.envoy("backend", backend_config(backends, backend_admin, keep_alive=args.upstream == "reuse"), backends[-1])
    paths: list[Path_] = []
    direct = free_port()
    paths.append(Path_("Envoy direct", f"http://127.0.0.1:{direct}", "direct",
                       front=procs.envoy("direct", direct_config(direct, free_port(), backends), direct)))
    if not args.no_peer and shutil.which(bin_path("vllm-router")):
        vr = free_port()
        router = procs.spawn("vllm-router", [
            bin_path("vllm-router"), "--host", "127.0.0.1", "--port", str(vr), "--policy", args.router_policy,
            "--log-level", "error", "--prometheus-port", str(free_port()), "--worker-urls",
            *[f"http://127.0.0.1:{p}" for p in backends]], vr)
        paths.append(Path_(f"vllm-router {args.router_policy}", f"http://127.0.0.1:{vr}", "router", processor=router))

    def front(name: str, port: int, variant: str, workers: int = 1) -> tuple[str, subprocess.Popen]:
        listen = free_port()
        cfg = front_config(listen, free_port(), port, variant=variant, phases=args.phases, backends=backends,
                           epp_workers=workers)
        return f"http://127.0.0.1:{listen}", procs.envoy(name, cfg, listen)

    for i, floor in enumerate(floors(args.floor)):
        label, flags, env = floor
        port = free_port()
        toy = procs.spawn(f"floor-{i}", [sys.executable, str(ROOT / "bench" / "toy_extproc.py"), "--port",
                                         str(port), "--backend", f"127.0.0.1:{backends[0]}", *flags], port, env=env)
        url, envoy = front(f"front-floor-{i}", port, "original-dst+BUFFERED" if "--buffered" in flags else "original-dst")
        paths.append(Path_(f"floor: do-nothing processor ({label})", url, "floor", processor=toy, front=envoy,
                           mode="BUFFERED" if "--buffered" in flags else "FULL_DUPLEX_STREAMED"))
    eps = procs.dir / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
        {"address": "127.0.0.1", "port": p} for p in backends[: args.endpoints]]}]}))
    otlp = ""
    if any("{otlp}" in c for c in args.candidate or []):  # a do-nothing OTLP/gRPC collector for tracing candidates
        sink = free_port()
        procs.spawn("otlp-sink", [sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(sink)], sink)
        otlp = f"http://127.0.0.1:{sink}"
    for i, text in enumerate(args.candidate or [":"]):
        label, variant, flags, env = parse_candidate(text, args.variant)
        flags = [f.replace("{port}", str(free_port())) if "{port}" in f else f for f in flags]
        flags = [f.replace("{otlp}", otlp) for f in flags]
        port = free_port()
        epp = procs.spawn(f"epp-{i}", [bin_path("epp"), "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1",
                                       "--grpc-port", str(port),
                                       "--grpc-health-port", "0", "--metrics-port", "0", "--endpoints-file",
                                       str(eps), "-v", "0", *flags], port, env=env)
        workers = int(flags[flags.index("--workers") + 1]) if "--workers" in flags else 1
        url, envoy = front(f"front-epp-{i}", port, variant, workers)  # one stream per worker per Envoy thread
        paths.append(Path_(label, url, "pointsman", processor=epp, front=envoy,
                           mode=variant.partition("+")[2] or "FULL_DUPLEX_STREAMED"))
    for p in paths:  # warm up (and fail early on a broken path)
        if wrk(p.url, 4, 1, script)[3]:
            raise RuntimeError(f"{p.name}: socket errors while warming up")
    return paths, backend_admin


def measure(args: argparse.Namespace, paths: list[Path_], backend_admin: int, scripts: dict[int, Path]) -> None:
    conns_list = [int(c) for c in args.conns.split(",")]
    for r in range(args.rounds):
        for size, script in scripts.items():
            for conns in conns_list:
                k = r % len(paths)
                for p in paths[k:] + paths[:k]:  # rotate the order: no path always runs right after another
                    pids = [x.pid for x in (p.processor, p.front) if x is not None]
                    cpu0 = {pid: cpu_seconds(pid) for pid in pids}
                    cx0 = backend_connections(backend_admin)
                    rps, p50, total, errors = wrk(p.url, conns, args.duration, script)
                    if errors:
                        print(f"{p.name}: {errors} socket errors or timeouts (> 5 s)", file=sys.stderr)
                    p.errors += errors
                    cx = backend_connections(backend_admin) - cx0
                    per = {pid: (cpu_seconds(pid) - cpu0[pid]) / max(total, 1) * 1e6 for pid in pids}
                    proc_cpu = per[p.processor.pid] if p.processor is not None else float("nan")
                    front_cpu = per[p.front.pid] if p.front is not None else float("nan")
                    p.rows.setdefault((conns, size), []).append(
                        (rps, p50, proc_cpu, front_cpu, cx / max(total, 1) * 1000))
                print(f"round {r + 1}/{args.rounds}: {size}-byte body at {conns} connections done", file=sys.stderr)


def med(rows: list[tuple[float, ...]], i: int) -> float:
    return statistics.median(row[i] for row in rows)


def fmt(x: float, spec: str = ".0f") -> str:
    return "-" if x != x else format(x, spec)


def table(args: argparse.Namespace, paths: list[Path_], sizes: list[int], load: tuple[float, float]) -> str:
    out = [f"{args.rounds} interleaved rounds x {args.duration:g}s, medians; {args.phases} response phases, "
           f"{args.endpoints} endpoint(s), upstream connections {args.upstream}; 1-minute load average "
           f"{load[0]:.1f} before, {load[1]:.1f} after (this run itself adds about 3)", ""]
    out.append("| path | body bytes | conns | req/s | vs vllm-router | vs floor | p50 ms | added p50 ms "
               "| processor CPU µs/req | front Envoy CPU µs/req | upstream conns /1k req |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for conns in [int(c) for c in args.conns.split(",")]:
            key = (conns, size)
            router = next((med(p.rows[key], 0) for p in paths if p.kind == "router"), float("nan"))
            floor = next((med(p.rows[key], 0) for p in paths if p.kind == "floor"), float("nan"))
            direct = next((med(p.rows[key], 1) for p in paths if p.kind == "direct"), float("nan"))
            for p in paths:
                rows = p.rows[key]
                rps = med(rows, 0)
                out.append(f"| {p.name} | {size} | {conns} | {rps:.0f} | {fmt(rps / router, '.2f')}x "
                           f"| {fmt(rps / floor, '.2f')}x | {med(rows, 1):.2f} | {fmt(med(rows, 1) - direct, '.2f')} "
                           f"| {fmt(med(rows, 2))} "
                           f"| {fmt(med(rows, 3))} | {med(rows, 4):.1f} |")
    if len(sizes) > 1:
        out += ["", *increments(args, paths, sizes)]
    failing = [f"{p.name} ({p.errors})" for p in paths if p.errors]
    out.append("")
    out.append("Socket errors or timeouts over 5 s: " + (", ".join(failing) if failing else "none"))
    return "\n".join(out)


def increments(args: argparse.Namespace, paths: list[Path_], sizes: list[int]) -> list[str]:
    """Issue 32's ratios: how much each processor's CPU per request grows from the smallest body to each larger one,
    against its own front Envoy's growth over the same bodies and against the do-nothing floor's (the first floor
    in the same request body mode), all within this run. At most 1.00x against the front Envoy is the target.

    The front Envoys of one body mode do the same work per request, yet their growth differs by up to 30% between
    the paths of one run (the machine's noise, not their work): "pooled" is the median of it over every path of the
    mode, the steadier yardstick for a ratio."""
    base = sizes[0]
    out = [f"CPU µs per request added from {base} B to each size (medians), and the ratios of those increments",
           "", "| path | body mode | conns | body bytes | processor +µs | front Envoy +µs | processor / front Envoy "
           "| processor / pooled front Envoy | floor processor +µs | processor / floor |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    measured = [p for p in paths if p.processor is not None and p.front is not None]
    for conns in [int(c) for c in args.conns.split(",")]:
        for size in sizes[1:]:
            def grow(p: Path_, i: int, conns: int = conns, size: int = size) -> float:
                return med(p.rows[(conns, size)], i) - med(p.rows[(conns, base)], i)

            pooled = {m: statistics.median(grow(p, 3) for p in measured if p.mode == m) for m in {p.mode for p in measured}}
            for p in measured:
                floor = next((f for f in paths if f.kind == "floor" and f.mode == p.mode), None)
                d_proc, d_front = grow(p, 2), grow(p, 3)
                d_floor = grow(floor, 2) if floor is not None else float("nan")
                out.append(f"| {p.name} | {p.mode} | {conns} | {size} | {d_proc:.0f} | {d_front:.0f} "
                           f"| {ratio(d_proc, d_front)}x | {ratio(d_proc, pooled[p.mode])}x | {fmt(d_floor)} "
                           f"| {ratio(d_proc, d_floor)}x |")
    return out


def ratio(a: float, b: float) -> str:
    return fmt(a / b if b > 0 else float("nan"), ".2f")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--conns", default="16", help="comma list of wrk connection counts")
    ap.add_argument("--body-bytes", default="109",
                    help="comma list of chat body sizes, interleaved in one run (109: a one-line question)")
    ap.add_argument("--phases", choices=("lean", "full"), default="lean", help="response phases sent to processors")
    ap.add_argument("--variant", choices=("original-dst", "override-host"), default="original-dst",
                    help="the front Envoy's pool cluster for Pointsman candidates (the floor is original-dst)")
    ap.add_argument("--endpoints", type=int, default=1, choices=(1, 2, 3, 4), help="endpoints in Pointsman's pool")
    ap.add_argument("--candidate", action="append", help="'LABEL:VARIANT:FLAGS', repeatable (see above)")
    ap.add_argument("--floor", action="append",
                    help=f"a toy processor, repeatable; the first is the floor: one of {list(FLOORS)} (default gen), "
                         "or 'LABEL=[ENV=value ...] toy flags'")
    ap.add_argument("--upstream", choices=("reuse", "close"), default="reuse",
                    help="close: the backend closes every connection (the old harness: measures TCP setup)")
    ap.add_argument("--no-peer", action="store_true", help="skip vllm-router")
    ap.add_argument("--router-policy", default="cache_aware",
                    help="vllm-router --policy (cache_aware asks the worker to render every chat request first: "
                         "two upstream requests per request)")
    ap.add_argument("--model-last", action="store_true",
                    help="the chat bodies name their model after the prompt, as OpenAI's Python client writes them")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
    sizes = [int(b) for b in args.body_bytes.split(",")]
    procs = Procs()
    scripts = {}
    for size in sizes:
        scripts[size] = procs.dir / f"post-{size}.lua"
        scripts[size].write_text(wrk_script(chat_body(size, args.model_last)))
    try:
        load0 = os.getloadavg()[0]
        paths, backend_admin = start(args, procs, scripts[sizes[0]])
        measure(args, paths, backend_admin, scripts)
        text = table(args, paths, sizes, (load0, os.getloadavg()[0]))
    finally:
        procs.stop()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

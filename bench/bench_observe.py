"""The per-request CPU of observability, in process: tracing off / 0% (on, nothing sampled) / 1% / 100%, 2000
receipts kept, shadow profiles.

Each case is a real `epp serve` App (one endpoint, the built-in profile unless a case says otherwise) driven
through its director as the ext_proc session drives it (exchange, decide, the response phases, close), with the
event loop turning between requests so deferred shadow runs happen. The tracing cases export to a do-nothing
OTLP/gRPC collector (bench/otlp_sink.py) and flush inside their measurement, so the export thread's work is
theirs. CPU is the process's (every thread), per request; cases interleave round by round and medians are printed
with the ratio to `off`. The wire (gRPC, HTTP/2, Envoy) is not in it: bench/bench_extproc.py measures that.

With `--tree LABEL=PATH` (repeatable) it compares checkouts instead of cases: the `off` case of each tree (its own
`epp`, this script's driver) in a worker process of its own kept for the whole run, the trees taking turns in short
rounds, the order rotating, so that a machine shared with other work loads them alike. The per-request cost of a
small request before and after a change (docs/performance.md, "The small request's fixed cost") comes from it.
`--body` gives the trees a long body instead, sent as full duplex sends it, in 64 KB chunks (the exchange reads
them as they come, decides on the head when it can, and checks the rest at the end): `plain` is bench_extproc.py's
256 KB chat (one message of plain text), `agent` an agent's context of 300 turns full of escapes (280 KB);
`--model-last` moves their `model` after the prompt, where OpenAI's Python client writes it.

    .venv/bin/python bench/bench_observe.py --rounds 7 --requests 3000
    .venv/bin/python bench/bench_observe.py --case "trace 1%" --case "trace 100%"    # only these (and off)
    .venv/bin/python bench/bench_observe.py --rounds 60 --requests 1000 --tree before=/tmp/before --tree after=.
    .venv/bin/python bench/bench_observe.py --rounds 30 --requests 200 --body agent --tree before=/tmp/before --tree after=.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = "--serve-tree"  # a worker of --tree: the checkout it imports Pointsman from
TREE = Path(sys.argv[sys.argv.index(WORKER) + 1]).resolve() if WORKER in sys.argv[:-1] else ROOT
sys.path.insert(0, str(TREE))

import orjson  # noqa: E402

from epp.cmd.app import App  # noqa: E402
from epp.cmd.settings import ServeSettings  # noqa: E402
from epp.stack.ports import free_port, wait_port  # noqa: E402

HEADERS = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json",
           "x-request-id": "bench"}
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "How far is the moon? " * 4}]})
RESPONSE = {":status": "200", "content-type": "application/json"}
ANSWER = b'{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":5}}'
MD = [(b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"), (b"content-type", b"application/grpc"),
      (b"te", b"trailers"), (b"x-envoy-internal", b"true")]


def cases(otlp: str) -> dict[str, list[str]]:
    trace = ["--tracing", "--tracing-endpoint", otlp, "--tracing-sample-ratio"]
    shadow = ["--shadow-rate", "1e9", "--shadow-max-cpu", "1", "--shadow-config"]
    profiles = ROOT / "deploy" / "profiles"
    return {
        "off": [],
        "receipts 2000": ["--receipts", "2000"],
        "trace 0%": [*trace, "0"],
        "trace 1%": [*trace, "0.01"],
        "trace 100%": [*trace, "1"],
        "shadow el": [*shadow, str(profiles / "estimated-latency.yaml")],
        "shadow gie": [*shadow, str(profiles / "gie-default.yaml")],
    }


def long_body(kind: str, model_last: bool = False) -> bytes:
    """`plain`: bench_extproc.py's 256 KB chat; `agent`: 300 turns of 44-character lines with quotes, 280 KB.
    `model_last`: `messages` first, then `model` and `max_tokens`."""
    if kind == "plain":
        sys.path.insert(1, str(ROOT))
        from bench.extproc_stack import chat_body

        body = orjson.loads(chat_body(262_144))
    else:
        line = 'The quick brown fox said "hi" and went on.\n'
        turns = [{"role": ("user", "assistant")[i % 2], "content": line * 20} for i in range(300)]
        body = {"model": "m", "messages": turns}
    if model_last:
        body = {"messages": body["messages"], "model": body["model"], "max_tokens": 64}
    return orjson.dumps(body)


CHUNK = 65_536  # bytes per body message of a long body, as Envoy sends a large one in full duplex


async def drive(app: App, n: int, body: bytes = BODY) -> None:
    d = app.director
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] if body is not BODY else []
    headers = {**HEADERS, "content-length": str(len(body))}
    for _ in range(n):
        ex = d.exchange(MD) if d.tracing is not None else d.exchange()
        if not chunks:
            ex.decide(HEADERS, BODY, {})
        else:  # full duplex: each chunk read as it comes; the rest after an early decision is kept and checked
            early = False
            for i, c in enumerate(chunks):
                end = i == len(chunks) - 1
                if early:
                    ex.request_rest(c, end)
                elif ex.request_chunk(headers, c, end):
                    ex.decide(headers, None, {})
                    early = True
            if not early:
                ex.decide(headers, None, {})
        ex.response_headers(RESPONSE, {})
        ex.response_body(ANSWER, True)
        await asyncio.sleep(0)  # deferred work (a shadow run) goes now
        ex.close()


async def measure(app: App, n: int, body: bytes = BODY) -> float:
    t0 = time.process_time()
    await drive(app, n, body)
    if app.director.tracing is not None:
        await asyncio.to_thread(app.director.tracing.processor.force_flush)
    await asyncio.sleep(0)
    return (time.process_time() - t0) / n


def serve_settings(eps: Path, flags: list[str]) -> ServeSettings:
    return ServeSettings.from_argv(["--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()), "--grpc-health-port",
                                    "0", "--metrics-port", "0", "--endpoints-file", str(eps), "--seed", "1",
                                    "--passive-health", "false", *flags])


def endpoints_file() -> Path:
    eps = Path(tempfile.mkdtemp(prefix="bench-observe-")) / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9}\n")
    return eps


async def serve_tree(kind: str, model_last: bool) -> int:
    """A --tree worker: the `off` App of TREE; each line N on stdin -> its process CPU µs per request of N requests
    of the `kind` of body (`short`: BODY, sent whole)."""
    import epp

    if not Path(epp.__file__).resolve().is_relative_to(TREE):
        raise SystemExit(f"{TREE} does not hold the epp package this worker imported ({epp.__file__})")
    logging.disable(logging.WARNING)  # the endpoint's failed scrapes
    app = App(serve_settings(endpoints_file(), []))
    await app.start()
    body = BODY if kind == "short" else long_body(kind, model_last)
    await drive(app, 500, body)  # warm up
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            print(f"{await measure(app, int(line), body) * 1e6:.3f}", flush=True)
    finally:
        await app.stop(0)
    return 0


def compare_trees(trees: list[str], rounds: int, n: int, kind: str, model_last: bool) -> int:
    """The `off` case of each checkout, interleaved (see the module docstring)."""
    workers: dict[str, subprocess.Popen[str]] = {}
    for spec in trees:
        label, _, path = spec.rpartition("=")
        argv = [sys.executable, __file__, "--body", kind, *(["--model-last"] if model_last else []), WORKER, path]
        workers[label or path] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    times: dict[str, list[float]] = {k: [] for k in workers}
    load = os.getloadavg()[0]
    try:
        for w in workers.values():
            if w.stdout is None or w.stdout.readline().strip() != "ready":
                raise SystemExit("a tree's worker did not start")
        names = list(workers)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                w = workers[name]
                assert w.stdin is not None and w.stdout is not None
                w.stdin.write(f"{n}\n")
                w.stdin.flush()
                times[name].append(float(w.stdout.readline()))
    finally:
        for w in workers.values():
            w.communicate("\n", timeout=30)
    base = statistics.median(times[names[0]])
    print(f"{rounds} interleaved rounds x {n} requests per tree, the `off` case, {kind} body{' (model last)' if model_last else ''}; process CPU µs per "
          f"request; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print(f"| tree | median | p25 | min | vs {names[0]} |\n|---|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} | {statistics.quantiles(ts, n=4)[0]:.1f} | {min(ts):.1f} | {med / base:.3f} |")
    return 0


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=3000, help="requests per case per round")
    ap.add_argument("--case", action="append", default=[], help="only these cases (repeatable; `off` is always in)")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="compare these checkouts' `off` case instead (repeatable; the first is the reference)")
    ap.add_argument("--body", choices=["short", "plain", "agent"], default="short",
                    help="with --tree: the request body (short: a one-line chat sent whole; see above)")
    ap.add_argument("--model-last", action="store_true", help="with --body plain|agent: `model` after the prompt")
    ap.add_argument(WORKER, metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_tree:
        return await serve_tree(args.body, args.model_last)
    if args.tree:
        return compare_trees(args.tree, args.rounds, args.requests, args.body, args.model_last)
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "50")
    eps = endpoints_file()
    port = free_port()
    sink = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL)
    apps: dict[str, App] = {}
    try:
        wait_port(port)
        for name, flags in cases(f"http://127.0.0.1:{port}").items():
            if args.case and name != "off" and name not in args.case:
                continue
            apps[name] = app = App(serve_settings(eps, flags))
            await app.start()
            await drive(app, 500)  # warm up
        times: dict[str, list[float]] = {k: [] for k in apps}
        for r in range(args.rounds):
            for name, app in apps.items():
                times[name].append(await measure(app, args.requests))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for app in apps.values():
            await app.stop(0)
        sink.terminate()
        sink.wait(10)
    base = statistics.median(times["off"])
    print(f"{args.rounds} interleaved rounds x {args.requests} requests per case; process CPU per request, medians "
          f"(min in brackets); load average {os.getloadavg()[0]:.1f}\n")
    print("| case | CPU µs/request | vs off |\n|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e6:.1f} ({min(ts) * 1e6:.1f}) | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

"""The per-request CPU of observability, in process: tracing off / 0% (on, nothing sampled) / 1% / 100%, 2000
receipts kept, shadow profiles.

Each case is a real `epp serve` App (one endpoint, the built-in profile unless a case says otherwise) driven
through its director as the ext_proc session drives it (exchange, decide, the response phases, close), with the
event loop turning between requests so deferred shadow runs happen. The tracing cases export to a do-nothing
OTLP/gRPC collector (bench/otlp_sink.py) and flush inside their measurement, so the export thread's work is
theirs. CPU is the process's (every thread), per request; cases interleave round by round and medians are printed
with the ratio to `off`. The wire (gRPC, HTTP/2, Envoy) is not in it: bench/bench_extproc.py measures that.

    .venv/bin/python bench/bench_observe.py --rounds 7 --requests 3000
    .venv/bin/python bench/bench_observe.py --case "trace 1%" --case "trace 100%"    # only these (and off)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


async def drive(app: App, n: int) -> None:
    d = app.director
    for _ in range(n):
        ex = d.exchange(MD) if d.tracing is not None else d.exchange()
        ex.decide(HEADERS, BODY, {})
        ex.response_headers(RESPONSE, {})
        ex.response_body(ANSWER, True)
        await asyncio.sleep(0)  # deferred work (a shadow run) goes now
        ex.close()


async def measure(app: App, n: int) -> float:
    t0 = time.process_time()
    await drive(app, n)
    if app.director.tracing is not None:
        await asyncio.to_thread(app.director.tracing.processor.force_flush)
    await asyncio.sleep(0)
    return (time.process_time() - t0) / n


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=3000, help="requests per case per round")
    ap.add_argument("--case", action="append", default=[], help="only these cases (repeatable; `off` is always in)")
    args = ap.parse_args()
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "50")
    tmp = Path(tempfile.mkdtemp(prefix="bench-observe-"))
    eps = tmp / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9}\n")
    port = free_port()
    sink = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL)
    apps: dict[str, App] = {}
    try:
        wait_port(port)
        for name, flags in cases(f"http://127.0.0.1:{port}").items():
            if args.case and name != "off" and name not in args.case:
                continue
            settings = ServeSettings.from_argv(["--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()),
                                                "--grpc-health-port", "0", "--metrics-port", "0", "--endpoints-file",
                                                str(eps), "--seed", "1", "--passive-health", "false", *flags])
            apps[name] = app = App(settings)
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

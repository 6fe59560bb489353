"""Benchmark: the hand-written /metrics parser against prometheus_client's text parser.

Run:  python bench/bench_scrape.py [--repeat 7] [--number 300] [--http 128 --seconds 3]

For each exposition (realistic vLLM/SGLang/TRT-LLM text from tests/fleet/scrape/expositions.py) it times:
  fast  epp.fleet.scrape.parser.parse_metrics(body_bytes, engine, now)   (what the scraper runs)
  prom  prometheus_client.parser.text_string_to_metric_families(body.decode()) walked to extract the same values
and prints the median µs per exposition, the ratio, and the share of one core the fast parser needs to keep up
with 512 endpoints scraped every 50 ms (10,240 expositions/s).

With --http N it also runs the real MetricsScraper (aiohttp, keep-alive) against N /metrics servers living in a
separate process, and reports the scraper process's CPU per scrape (HTTP client + parse + datastore write), so
the whole cost per endpoint is visible, not just the parser's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fixtures are the tests' (tests/fleet/scrape/expositions.py)

import asyncio  # noqa: E402
import multiprocessing as mp  # noqa: E402

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from epp.fleet.scrape.parser import parse_metrics  # noqa: E402
from tests.fleet.scrape.expositions import (  # noqa: E402
    sglang_exposition,
    triton_exposition,
    trtllm_exposition,
    vllm_exposition,
)

ENDPOINTS, INTERVAL = 512, 0.05
WANTED = {
    "vllm": {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
             "vllm:cache_config_info", "vllm:lora_requests_info"},
    "sglang": {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info"},
    "trtllm-serve": {"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization",
                     "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_max_blocks"},
    "triton": {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"},
}


def prom_extract(body: bytes, engine: str) -> dict[str, list]:
    wanted = WANTED[engine]
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name in wanted:
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def timeit(fn, number: int, repeat: int) -> float:
    """Median seconds per call over `repeat` runs of `number` calls."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs)


def _serve(n: int, body: bytes, conn) -> None:  # runs in a child process
    from aiohttp import web

    async def handler(_):
        return web.Response(body=body, content_type="text/plain")

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(n):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])
        conn.send(ports)
        await asyncio.Event().wait()

    asyncio.run(run())


def http_bench(n: int, seconds: float) -> None:
    from epp.fleet.datastore import Datastore, PoolSpec
    from epp.fleet.scrape.scraper import MetricsScraper
    from scheduling.types import Endpoint

    body = vllm_exposition(waiting=3, running=12, kv=0.41)
    parent, child = mp.Pipe()
    proc = mp.Process(target=_serve, args=(n, body, child), daemon=True)
    proc.start()
    ports = parent.recv()

    async def run() -> tuple[int, int, float, float]:
        ds = Datastore()
        ds.set_pool(PoolSpec("bench"), [Endpoint(f"127.0.0.1:{p}", "127.0.0.1", p) for p in ports])
        scraper = MetricsScraper(ds, interval=INTERVAL)
        await scraper.scrape_round(wait=5.0)  # connect everything first
        scraped = [0]  # endpoints whose metrics were written (a tick of the spread loop scrapes one slot of them)
        ds.on_metrics_updated(lambda keys: scraped.__setitem__(0, scraped[0] + len(list(keys))))
        r0, cpu0, t0 = scraper.rounds, time.process_time(), time.perf_counter()
        scraper.start()
        await asyncio.sleep(seconds)
        await scraper.stop()
        rounds = scraper.rounds - r0
        return rounds, scraped[0], time.process_time() - cpu0, time.perf_counter() - t0

    rounds, scrapes, cpu, wall = asyncio.run(run())
    proc.terminate()
    per = cpu / max(1, scrapes)
    print(f"\nfull scraper, {n} endpoints, interval {INTERVAL * 1000:.0f} ms, {wall:.1f} s: "
          f"{rounds / wall:.1f} ticks/s, {scrapes / wall:,.0f} scrapes/s (target {n / INTERVAL:,.0f}), "
          f"{per * 1e6:.0f} µs CPU per scrape; at 512 endpoints / 50 ms that is "
          f"{per * ENDPOINTS / INTERVAL * 100:.0f}% of one core")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=300)
    ap.add_argument("--http", type=int, default=0, help="also run the real scraper against N local servers")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    lora = [(1732390000.0 + i, f"lora-{i}", "") for i in range(3)]
    cases = [
        ("vllm 1 engine", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41)),
        ("vllm + LoRA", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41, lora=lora)),
        ("vllm DP=4", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41, engines=4)),
        ("sglang", "sglang", sglang_exposition(waiting=2, running=9, usage=0.3)),
        ("trtllm-serve", "trtllm-serve", trtllm_exposition(waiting=1, running=5, util=0.2)),
        ("triton", "triton", triton_exposition(waiting=1, scheduled=5, fraction=0.2)),
    ]
    budget_us = INTERVAL / ENDPOINTS * 1e6
    print(f"{ENDPOINTS} endpoints every {INTERVAL * 1000:.0f} ms = {ENDPOINTS / INTERVAL:,.0f} expositions/s; "
          f"budget {budget_us:.1f} µs each on one core\n")
    hdr = f"{'exposition':<14} {'bytes':>7} {'lines':>6} {'fast µs':>9} {'prom µs':>9} {'ratio':>7} {'core @512/50ms':>15}"
    print(hdr)
    print("-" * len(hdr))
    for label, engine, body in cases:
        parse_metrics(body, engine, 0.0)  # warm up, and fail loudly on a broken fixture
        prom_extract(body, engine)
        fast = timeit(lambda b=body, e=engine: parse_metrics(b, e, 0.0), args.number, args.repeat)
        prom = timeit(lambda b=body, e=engine: prom_extract(b, e), max(10, args.number // 10), args.repeat)
        core = fast * ENDPOINTS / INTERVAL
        lines = body.count(b"\n")
        print(f"{label:<14} {len(body):>7} {lines:>6} {fast * 1e6:>9.1f} {prom * 1e6:>9.1f} "
              f"{prom / fast:>6.0f}x {core * 100:>14.1f}%")
    if args.http:
        http_bench(args.http, args.seconds)


if __name__ == "__main__":
    main()

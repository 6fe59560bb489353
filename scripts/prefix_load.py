"""A small load with shared prompt prefixes, for trying profiles on the local stack (docs/observability.md).

`--tenants` system prompts of `--prefix-words` words each; every request picks a tenant (Zipf-like: the first ones
more often) and a fresh question, and asks for `--max-tokens`. `--concurrency` clients send back to back for
`--duration` seconds to `--url` (the stack's Envoy listener). Prints requests, errors and latency percentiles.

    .venv/bin/python scripts/prefix_load.py --url http://127.0.0.1:8081 --duration 60 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import aiohttp
import orjson

MODEL = "meta-llama/Llama-3.1-8B"


async def client(args: argparse.Namespace, rng: random.Random, stop: float, out: list[float], errors: list[int]
                 ) -> None:
    weights = [1.0 / (i + 1) for i in range(args.tenants)]
    prefixes = [" ".join(f"t{t}w{i}" for i in range(args.prefix_words)) for t in range(args.tenants)]
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < stop:
            tenant = rng.choices(range(args.tenants), weights)[0]
            body = {"model": MODEL, "max_tokens": args.max_tokens, "messages": [
                {"role": "system", "content": prefixes[tenant]},
                {"role": "user", "content": f"question {rng.random():.12f}"}]}
            t0 = time.monotonic()
            try:
                async with s.post(args.url + "/v1/chat/completions", data=orjson.dumps(body),
                                  headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        errors.append(r.status)
                        continue
            except aiohttp.ClientError:
                errors.append(0)
                continue
            out.append(time.monotonic() - t0)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8081")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--prefix-words", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    stop = time.monotonic() + args.duration
    latencies: list[float] = []
    errors: list[int] = []
    await asyncio.gather(*(client(args, random.Random(args.seed + i), stop, latencies, errors)
                           for i in range(args.concurrency)))
    if not latencies:
        print(f"no request succeeded ({len(errors)} errors)")
        return 1
    q = statistics.quantiles(latencies, n=100)
    print(f"{len(latencies)} requests, {len(errors)} errors; latency p50 {q[49] * 1e3:.0f} ms, "
          f"p90 {q[89] * 1e3:.0f} ms, mean {statistics.fmean(latencies) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

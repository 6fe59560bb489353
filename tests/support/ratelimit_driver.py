"""One 'Pointsman process' for the shared-limit tests: a Limiter on a real Redis, hammered by concurrent requests.

    python -m tests.support.ratelimit_driver --redis-url URL --scenario rate|budget --amount N [--barrier]

Each of `--concurrency` workers loops: admit a request with a random input size (and output estimate), hold it a
moment, settle it with a random real output (never above the estimate, so a budget is never overdrawn by
reconciliation), until it has been refused `--give-up` times in a row or `--max-seconds` passed. Prints one JSON
line: what this process admitted and settled, so the test can add both processes up and compare with Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from epp.ratelimit import Limit, Limiter, RedisStore


def limits(scenario: str, amount: float) -> list[Limit]:
    if scenario == "rate":
        # A month-long bucket refills ~0.04 tokens/s per 100k: the run sees the capacity alone.
        return [Limit.per_unit("shared-route", "input_tokens", amount, "month", shared=True)]
    if scenario == "budget":
        return [Limit.rolling("shared-budget", "total_tokens", amount, 3600, shared=True)]
    raise SystemExit(f"unknown scenario {scenario!r}")


async def worker(limiter: Limiter, applied: list[tuple[Limit, str]], rng: random.Random, stats: dict[str, float],
                 give_up: int, deadline: float) -> None:
    refused_in_a_row = 0
    while refused_in_a_row < give_up and time.monotonic() < deadline:
        inp = rng.randint(20, 400)
        est = rng.randint(0, 200)
        adm = await limiter.admit(applied, inp, est)
        if not adm.allowed:
            refused_in_a_row += 1
            stats["refused"] += 1
            await asyncio.sleep(0.001)
            continue
        refused_in_a_row = 0
        stats["admitted"] += 1
        stats["admitted_input"] += inp
        if adm.degraded:
            stats["degraded"] += 1
        await asyncio.sleep(rng.random() * 0.003)
        out = rng.randint(0, est)
        limiter.settle(adm.ticket, output_tokens=out)
        stats["settled_total"] += inp + out


async def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--scenario", choices=("rate", "budget"), required=True)
    p.add_argument("--amount", type=float, required=True)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--give-up", type=int, default=25)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--barrier", action="store_true",
                   help="print 'ready', then start when a line arrives on stdin (lines up several processes)")
    a = p.parse_args(argv)
    store = RedisStore(a.redis_url, timeout_s=2.0)  # generous: this test is about exactness, not latency
    limiter = Limiter(redis=store, redis_down="fail-open")
    applied = [(lim, "") for lim in limits(a.scenario, a.amount)]
    stats = {"admitted": 0.0, "refused": 0.0, "admitted_input": 0.0, "settled_total": 0.0, "degraded": 0.0}
    await limiter.admit(applied, 0, dry_run=True)  # connected, script loaded: ready to go at once
    if a.barrier:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    deadline = time.monotonic() + a.max_seconds
    await asyncio.gather(*(worker(limiter, applied, random.Random(a.seed * 1000 + i), stats, a.give_up, deadline)
                           for i in range(a.concurrency)))
    await limiter.flush()
    stats["pending"] = float(limiter.pending)
    stats["redis_calls"] = float(store.calls)
    await limiter.close()
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))

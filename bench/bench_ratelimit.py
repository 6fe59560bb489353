"""Rate-limit admission micro-benchmark (not a test): local limits against shared (Redis) limits, one run.

Cases, interleaved round by round in a shuffled order so machine noise hits them alike, each timed around one
`admit` + `settle`
(what the director adds to a request):
- floor:            `admit([])`, no limit applies (the cost every request pays with rate limits on);
- local sync:       `admit_nowait`, a Kthena route's input + output buckets and a team budget (3 limits);
- local await:      the same through `await admit(...)`;
- redis 1 limit:    one shared input bucket: one EVALSHA round trip to a real redis-server on loopback;
- redis 3 limits:   the three limits above, shared: still one round trip;
- redis down:       a second redis-server paused (SIGSTOP), policy `local`: admissions skip it while it is marked
                    down (the first one waited for the 30 ms timeout, before the measured rounds).
Then concurrency: 64 coroutines admitting against the shared limits, requests per second, local vs Redis.

    python bench/bench_ratelimit.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epp.ratelimit import Limit, Limiter, RedisStore  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

BIG = 10**12  # limits that never refuse: the benchmark measures the cost of deciding, not of refusing


def limits(shared: bool) -> list[tuple[Limit, str]]:
    return [(Limit.per_unit("route-in", "input_tokens", BIG, "minute", shared=shared), ""),
            (Limit.per_unit("route-out", "output_tokens", BIG, "minute", shared=shared), ""),
            (Limit.rolling("team-cap", "total_tokens", BIG, 3600, shared=shared), "team-a")]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def throughput(limiter: Limiter, applied: list[tuple[Limit, str]], seconds: float) -> int:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            adm = await limiter.admit(applied, 100, 50)
            limiter.settle(adm.ticket, output_tokens=40)
            done += 1
            await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(64)))
    return done


async def main(rounds: int) -> None:
    srv, dead = RedisServer().start(), RedisServer().start()
    try:
        store = RedisStore(srv.url, timeout_s=0.05)
        local = Limiter()
        shared = Limiter(redis=store)
        down = Limiter(redis=RedisStore(dead.url, timeout_s=0.03), redis_down="local", retry_interval_s=3600)
        loc3, red3 = limits(False), limits(True)
        red1 = red3[:1]
        await down.admit(red3, 1)
        dead.pause()  # a hung server: the first call waits for the timeout, the others skip it for an hour
        await down.admit(red3, 1)

        async def floor() -> None:
            adm = await local.admit([], 100)
            local.settle(adm.ticket)

        async def local_sync() -> None:
            adm = local.admit_nowait(loc3, 100, 50)
            assert adm is not None and adm.allowed
            local.settle(adm.ticket, output_tokens=40)

        async def local_await() -> None:
            adm = await local.admit(loc3, 100, 50)
            local.settle(adm.ticket, output_tokens=40)

        async def redis1() -> None:
            adm = await shared.admit(red1, 100, 50)
            assert not adm.degraded
            shared.settle(adm.ticket, output_tokens=40)

        async def redis3() -> None:
            adm = await shared.admit(red3, 100, 50)
            assert not adm.degraded
            shared.settle(adm.ticket, output_tokens=40)

        async def redis_down() -> None:
            adm = await down.admit(red3, 100, 50)
            assert adm.degraded
            down.settle(adm.ticket, output_tokens=40)

        cases: dict[str, Callable[[], Awaitable[None]]] = {
            "floor (no limit)": floor, "local, admit_nowait": local_sync, "local, await admit": local_await,
            "redis, 1 limit": redis1, "redis, 3 limits": redis3, "redis down (policy local)": redis_down}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(200):  # warm up (script loaded, connections open)
            for fn in cases.values():
                await fn()
        rng = random.Random(1)
        order = list(cases.items())
        for _ in range(rounds):
            rng.shuffle(order)  # no case always follows the same one (caches, the loop's pending I/O)
            for name, fn in order:
                t0 = time.perf_counter_ns()
                await fn()
                times[name].append((time.perf_counter_ns() - t0) / 1000)
        await shared.flush()

        base = statistics.median(times["local, admit_nowait"])
        print(f"admission latency, {rounds} rounds interleaved (µs; ratio = p50 / p50 of local admit_nowait)")
        print(f"{'case':32} {'p50':>9} {'p99':>9} {'ratio':>7}")
        for name, vals in times.items():
            p50 = statistics.median(vals)
            print(f"{name:32} {p50:9.1f} {pct(vals, 0.99):9.1f} {p50 / base:7.2f}")

        print("\nthroughput, 64 concurrent coroutines, 3 limits (requests/s)")
        for name, limiter, applied in (("local", local, loc3), ("redis", shared, red3)):
            done = await throughput(limiter, applied, 2.0)
            print(f"{name:32} {done / 2.0:9.0f}")
        await shared.close()
    finally:
        dead.resume()
        await down.close()
        srv.stop()
        dead.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5000)
    asyncio.run(main(ap.parse_args().rounds))

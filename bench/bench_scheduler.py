"""Scheduler micro-benchmark (not a test).

1. Decision cost of two profiles side by side at 8, 64, 256, 512, 1024 and 2048 endpoints, one process, interleaved
   per decision, the order alternating (default, GIE, GIE, default, ...: whichever decides a request first pays for
   bringing its 16 KB prompt into the cache, up to 20 µs):
   - "default": the built-in default profile, what Pointsman runs with no config (estimated-latency-scorer ×1,
     max-score-picker; deploy/profiles/estimated-latency.yaml);
   - "GIE": GIE's default weights (deploy/profiles/gie-default.yaml: queue ×2, kv-cache-utilization ×2,
     prefix-cache ×3, max-score-picker).
   The prompt is 16 KB: one of 8 shared 4 KB system prompts followed by a unique 12 KB conversation, against a
   prefix index warmed by 200 decisions. Reports the median (and p10) of schedule() per profile, their ratio, the
   median of pre_request() (which hashes the rest of the prompt and records its blocks), and schedule()'s cost per
   endpoint beyond the smallest pool, (median(n) − median(smallest)) / (n − smallest) in µs: flat when the cost
   grows linearly with the pool.
   With --busy, a busy pool instead: requests in flight on half of the endpoints (1-19 each), every endpoint picked
   and its requests finished during the warm-up (so each has a learnt duration and calibration), 2 ms between
   decisions (prefill backlogs do not drain).
2. The prefix index's memory (tracemalloc) at 512 endpoints × 31,250 blocks (worst case: no block shared by two
   endpoints), then again after inserting as many blocks again: a bounded index does not grow.

    python bench/bench_scheduler.py [--quick] [--skip-memory] [--cpu-clock] [--busy] [--endpoints 8,64,256,...]
        [--profile NAME=FILE ...]   (more configs timed in the same interleaved run)

Use --cpu-clock (the thread CPU clock) on a shared machine: it does not count time the thread spent descheduled.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduling.api import InflightLoad, SchedulingContext  # noqa: E402
from scheduling.config import ModelScheduler, load_scheduler  # noqa: E402
from scheduling.prefix import PrefixIndex  # noqa: E402
from scheduling.types import Endpoint, LLMRequest, Metrics  # noqa: E402

PROMPT_CHARS = 16 * 1024
SYSTEM_CHARS = 4 * 1024
WARM = 200
PROFILES: dict[str, Path | None] = {"default": None, "GIE": ROOT / "deploy" / "profiles" / "gie-default.yaml"}
ITERS = {8: 2000, 64: 2000, 256: 1500, 512: 1000, 1024: 600, 2048: 400}

Clock = Callable[[], int]


def endpoints(n: int, rnd: random.Random) -> list[Endpoint]:
    out = []
    for i in range(n):
        addr = f"10.{i // 250}.{i % 250}.1"
        m = Metrics(
            waiting=rnd.randrange(0, 8), running=rnd.randrange(0, 32), kv_usage=rnd.random(), stale=False
        )
        out.append(Endpoint(f"{addr}:8000", addr, 8000, name=f"pod-{i}", metrics=m))
    return out


def prompt(i: int, system: str, rnd: random.Random) -> str:
    body = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz ,.") for _ in range(64))
    tail = (f"[turn {i}] " + body) * ((PROMPT_CHARS - SYSTEM_CHARS) // (len(body) + 12) + 1)
    return (system + tail)[:PROMPT_CHARS]


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def requests(n: int, count: int) -> tuple[list[Endpoint], list[LLMRequest]]:
    rnd = random.Random(n)
    eps = endpoints(n, rnd)
    systems = ["".join(rnd.choice("ABCDEFGHIJ \n") for _ in range(SYSTEM_CHARS)) for _ in range(8)]
    prompts = [prompt(i, systems[i % len(systems)], rnd) for i in range(count)]
    return eps, [LLMRequest(f"r{i}", "llama", "llama", prompt=p) for i, p in enumerate(prompts)]


def bench_decisions(n: int, iters: int, clock: Clock, busy: bool = False) -> dict[str, tuple[float, float, float]]:
    """profile -> (schedule() median µs, schedule() p10 µs, pre_request() median µs), interleaved per decision."""
    warm = 2 * n + WARM if busy else WARM
    eps, reqs = requests(n, iters + warm)
    step = 0.002 if busy else 1.0  # seconds between decisions
    rnd = random.Random(5)
    inflight = {e.key: InflightLoad(rnd.randrange(1, 20), 0) for e in eps if rnd.random() < 0.5} if busy else {}
    scheds: dict[str, ModelScheduler] = {
        name: load_scheduler(src, rng=random.Random(7)) for name, src in PROFILES.items()
    }
    for sched in scheds.values():
        for i in range(warm):
            ctx = SchedulingContext(reqs[i], eps, inflight, now=i * step)
            res = sched.schedule(ctx)
            sched.pre_request(ctx, res)
            if busy:
                sched.response_complete(SchedulingContext(reqs[i], eps, inflight, now=i * step + 0.5), res)
    sched_ns: dict[str, list[int]] = {name: [] for name in scheds}
    pre_ns: dict[str, list[int]] = {name: [] for name in scheds}
    gc.collect()
    gc.disable()
    try:
        names = list(scheds)
        for i in range(warm, warm + iters):
            # the order alternates: the first to see a request pays for bringing its prompt into the cache
            for name in names if i % 2 else names[::-1]:
                sched = scheds[name]
                ctx = SchedulingContext(reqs[i], eps, inflight, now=i * step)
                t0 = clock()
                res = sched.schedule(ctx)
                t1 = clock()
                sched.pre_request(ctx, res)
                t2 = clock()
                sched_ns[name].append(t1 - t0)
                pre_ns[name].append(t2 - t1)
    finally:
        gc.enable()
    return {
        name: (statistics.median(sched_ns[name]) / 1000, pct(sched_ns[name], 0.1), statistics.median(pre_ns[name]) / 1000)
        for name in scheds
    }


def fill(index: PrefixIndex, n_endpoints: int, blocks: int, start: int) -> int:
    """Record `blocks` distinct blocks per endpoint, 256 per request; returns the next hash seed."""
    mask = (1 << 64) - 1
    h = start
    for e in range(n_endpoints):
        key = f"10.{e // 250}.{e % 250}.1:8000"
        for _ in range(0, blocks, 256):
            batch = [((h + j) * 0x9E3779B97F4A7C15) & mask for j in range(256)]
            h += 256
            index.record(key, batch)
    return h


def bench_memory(n_endpoints: int, capacity: int, rounds: int = 3) -> list[tuple[int, float, int, int]]:
    """[(blocks inserted per endpoint, traced MiB, distinct blocks, blocks held)] after each round of
    `capacity` new blocks per endpoint."""
    gc.collect()
    tracemalloc.start()
    index = PrefixIndex(capacity)
    base = tracemalloc.get_traced_memory()[0]
    out = []
    nxt = 1
    for r in range(1, rounds + 1):
        nxt = fill(index, n_endpoints, capacity, nxt)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - base
        held = sum(index.size(k) for k in index.endpoints())
        out.append((r * capacity, traced / 2**20, len(index), held))
    tracemalloc.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations; memory at 64 endpoints only")
    ap.add_argument("--skip-memory", action="store_true", help="only time decisions")
    ap.add_argument(
        "--cpu-clock", action="store_true", help="time with the thread CPU clock (robust on a busy machine)"
    )
    ap.add_argument("--busy", action="store_true", help="a busy pool: in-flight requests, learnt state, backlogs")
    ap.add_argument("--endpoints", default="8,64,256,512,1024,2048",
                    help="comma-separated pool sizes (default %(default)s)")
    ap.add_argument("--profile", action="append", default=[], metavar="NAME=FILE",
                    help="also time this config in the same interleaved run (repeatable; rows after the table)")
    args = ap.parse_args()
    for spec in args.profile:
        name, _, path = spec.partition("=")
        if not name or not path or name in PROFILES:
            ap.error(f"--profile {spec!r}: expected NAME=FILE with a new NAME")
        PROFILES[name] = Path(path)
    sizes = [int(s) for s in args.endpoints.split(",") if s]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}; prompt {PROMPT_CHARS} chars (256 blocks of 64 chars); "
        f"{os.cpu_count()} CPUs, load average {load:.2f}; "
        f"clock: {'thread CPU time' if args.cpu_clock else 'wall (perf_counter)'}; "
        f"pool: {'busy' if args.busy else 'idle, warm index'}\n"
    )
    print(
        "| endpoints | default schedule() µs | GIE schedule() µs | default / GIE | default p10 µs | GIE p10 µs "
        "| default pre_request() µs | GIE pre_request() µs | default µs / endpoint | GIE µs / endpoint |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    clock = time.thread_time_ns if args.cpu_clock else time.perf_counter_ns
    extra: list[str] = []
    first: tuple[int, float, float] | None = None  # the smallest pool: (endpoints, default, GIE)
    for n in sizes:
        iters = ITERS.get(n, 400) // (4 if args.quick else 1)
        got = bench_decisions(n, iters, clock, args.busy)
        (d, d10, dp), (g, g10, gp) = got["default"], got["GIE"]
        per = "| – | – |"
        if first is None:
            first = (n, d, g)
        elif n > first[0]:
            per = f"| {(d - first[1]) / (n - first[0]):.3f} | {(g - first[2]) / (n - first[0]):.3f} |"
        print(f"| {n} | {d:.1f} | {g:.1f} | {d / g:.2f}x | {d10:.1f} | {g10:.1f} | {dp:.1f} | {gp:.1f} {per}",
              flush=True)
        extra += [f"| {n} | {name} | {v[0]:.1f} | {v[0] / g:.2f}x | {v[2]:.1f} |"
                  for name, v in got.items() if name not in ("default", "GIE")]
    if extra:
        print("\n| endpoints | profile | schedule() µs | vs GIE | pre_request() µs |\n|---:|---|---:|---:|---:|")
        print("\n".join(extra))
    if args.skip_memory:
        return
    n_ep = 64 if args.quick else 512
    cap = 31_250
    rows = bench_memory(n_ep, cap)
    print(f"\nPrefix index, {n_ep} endpoints, capacity {cap} blocks each, no block shared (worst case):\n")
    print(
        "| blocks inserted per endpoint | blocks held | distinct blocks | traced MiB | bytes per held block |"
    )
    print("|---:|---:|---:|---:|---:|")
    for inserted, mib, distinct, held in rows:
        print(f"| {inserted} | {held} | {distinct} | {mib:.1f} | {mib * 2**20 / held:.1f} |")


if __name__ == "__main__":
    main()

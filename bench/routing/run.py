"""Routing benchmark runner: a fresh modelsim fleet per (router, regime), a QPS ladder per regime.

    python -m bench.routing.run                 # full run, all routers and regimes
    python -m bench.routing.run --quick         # a few minutes: 2 regimes, 2 QPS points, short stages
    python -m bench.routing.run --routers oracle,envoy-rr --regimes pressure --qps 10,20

Writes bench/out/routing/results.md, results.json and one PNG per regime. All latencies and rates are in
*model* time (wall time / time scale), so runs at different time scales are comparable; router overhead
is magnified by 1/time_scale in model time. Regimes are sized against the fleet's KV cache:
``pressure`` makes distinct prefixes about 73% of the cluster's KV (several times one server's).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from bench.routing.client import run_stage
from bench.routing.procs import ROOT, Proc, free_port_block, wait_http
from bench.routing.report import Row, markdown, summarize, write_outputs
from bench.routing.routers import DEFAULT_ROUTERS, ROUTERS, FleetInfo, Launched, Unavailable
from bench.routing.workload import Planned, Workload, WorkloadSpec

MODEL = "meta-llama/Llama-3.1-8B"


@dataclass(frozen=True)
class Regime:
    name: str
    spec: WorkloadSpec
    qps: tuple[float, ...]
    outside: float = 0.0  # fraction of requests sent straight to a (uniformly chosen) server, bypassing the router
    reset_every: float = 0.0  # model seconds between prefix-cache resets of one server (rotating); 0 = none
    warmup: bool = False  # one unmeasured request per group through the router first (the disturbances, not the
    # cold start, are what these regimes measure)


@dataclass(frozen=True)
class FleetSpec:
    servers: int = 4
    kv_cache_size: int = 1024  # blocks of 16 tokens per server
    max_num_seqs: int = 16
    time_scale: float = 0.5
    stream_interval_ms: float = 20.0

    @property
    def cluster_tokens(self) -> int:
        return self.servers * self.kv_cache_size * 16


def regimes(fleet: FleetSpec) -> dict[str, Regime]:
    """Workloads sized against the fleet's KV capacity."""
    per_server = fleet.kv_cache_size * 16
    pressure_groups = max(2, round(0.73 * fleet.cluster_tokens / 2000))
    return {
        # working set ~20% of the cluster's KV, well under one server's
        "fits": Regime("fits", WorkloadSpec(num_groups=max(2, per_server // 2 // 1536), prompts_per_group=5,
                                            system_prompt_len=1536, question_len=128, output_len=64),
                       (10, 20, 40)),
        # distinct system prompts ~73% of the cluster's KV
        "pressure": Regime("pressure", WorkloadSpec(num_groups=pressure_groups, prompts_per_group=5,
                                                    system_prompt_len=2000, question_len=200, output_len=64),
                           (5, 10, 20, 30)),
        # Zipf popularity over many groups, longer outputs
        "skew": Regime("skew", WorkloadSpec(num_groups=2 * pressure_groups, prompts_per_group=8,
                                            system_prompt_len=1000, question_len=100, output_len=192, zipf_s=1.1),
                       (5, 10, 15)),
        # nothing shared: every prompt unique
        "no-sharing": Regime("no-sharing", WorkloadSpec(num_groups=1, prompts_per_group=10**9, system_prompt_len=0,
                                                        question_len=1500, output_len=64), (5, 10, 20)),
        # the pressure workload, with 30% of the requests sent straight to the servers (another router, batch
        # jobs): they fill and evict caches that only the engines' own KV events tell a router about
        "outside-traffic": Regime("outside-traffic", WorkloadSpec(num_groups=pressure_groups, prompts_per_group=5,
                                                                  system_prompt_len=2000, question_len=200,
                                                                  output_len=64),
                                  (10, 20, 30), outside=0.3, warmup=True),
        # the pressure workload while one server's prefix cache is reset every 10 s (a restart, an operator's
        # /reset_prefix_cache), running requests included
        "cache-resets": Regime("cache-resets", WorkloadSpec(num_groups=pressure_groups, prompts_per_group=5,
                                                            system_prompt_len=2000, question_len=200, output_len=64),
                               (10, 20, 30), reset_every=10.0, warmup=True),
    }


def start_fleet(fs: FleetSpec, workdir: Path, name: str) -> tuple[Proc, FleetInfo]:
    base = free_port_block(fs.servers)
    kv_base = free_port_block(fs.servers)
    replay_base = free_port_block(fs.servers)
    oracle_port = free_port_block(1)
    argv = [sys.executable, "-m", "modelsim", "--servers", str(fs.servers), "--base-port", str(base),
            "--model", MODEL, "--time-scale", str(fs.time_scale), "--kv-cache-size", str(fs.kv_cache_size),
            "--max-num-seqs", str(fs.max_num_seqs), "--kv-events-port", str(kv_base),
            "--kv-events-replay-port", str(replay_base),
            "--stream-interval-ms", str(fs.stream_interval_ms), "--oracle-port", str(oracle_port)]
    proc = Proc(f"modelsim-{name}", argv, workdir)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(fs.servers)]
    kv = [f"tcp://127.0.0.1:{kv_base + i}" for i in range(fs.servers)]
    replay = [f"tcp://127.0.0.1:{replay_base + i}" for i in range(fs.servers)]
    return proc, FleetInfo(urls, MODEL, kv, f"http://127.0.0.1:{oracle_port}", time_scale=fs.time_scale,
                           max_num_seqs=fs.max_num_seqs, kv_replay_endpoints=replay)


async def _fleet_stats(fleet: FleetInfo) -> str:
    parts = []
    async with aiohttp.ClientSession() as s:
        for u in fleet.urls:
            try:
                async with s.get(f"{u}/admin/state", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    st = await r.json()
                parts.append(f"{st['pod']}: hits {st['prefix_hits']}/{st['prefix_queries']} "
                             f"evictions {st['evictions']} preemptions {st['preemptions']} "
                             f"timer lag mean/max {st['timer_lag_mean_ms']:.1f}/{st['timer_lag_max_ms']:.0f} ms")
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError) as exc:
                parts.append(f"{u}: {exc}")
    return "; ".join(parts)


def outside_plan(plan: list[Planned], urls: list[str], fraction: float, seed: str) -> dict[int, str]:
    """Which planned requests bypass the router, and the server each goes to (seeded: the same for every router)."""
    if fraction <= 0:
        return {}
    rng = random.Random(seed)
    out = {}
    for i in range(len(plan)):
        if rng.random() < fraction:
            out[i] = rng.choice(urls) + "/v1/chat/completions"
    return out


async def reset_caches(fleet: FleetInfo, every_wall: float, done: list[int]) -> None:
    """Every `every_wall` seconds, reset one server's prefix cache (in turn), running requests included."""
    async with aiohttp.ClientSession() as s:
        i = 0
        while True:
            await asyncio.sleep(every_wall)
            url = fleet.urls[i % len(fleet.urls)]
            i += 1
            try:
                async with s.post(f"{url}/reset_prefix_cache?reset_running_requests=true",
                                  timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        done.append(i)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass


async def run_one(router: str, regime: Regime, fs: FleetSpec, duration: float, max_requests: int,
                  workdir: Path, seed: int) -> list[Row]:
    wd = workdir / f"{router}-{regime.name}"
    wd.mkdir(parents=True, exist_ok=True)
    fleet_proc, fleet = start_fleet(fs, wd, regime.name)
    launched: Launched | None = None
    rows: list[Row] = []
    try:
        for u in fleet.urls:
            await wait_http(f"{u}/health", fleet_proc, 30.0)
        launched = await ROUTERS[router](fleet, wd)
        wl = Workload(regime.spec, MODEL, seed)
        if regime.warmup:
            await run_stage(launched.url + "/v1/chat/completions", wl.warmup(8.0), fs.time_scale,
                            request_timeout=60.0, stage_timeout=120.0)
        for i, qps in enumerate(regime.qps):
            plan = wl.plan(qps, duration, max_requests, stage_seed=i)
            direct = outside_plan(plan, fleet.urls, regime.outside, f"{seed}/outside/{i}/{qps}")
            t0 = time.monotonic()
            resets: list[int] = []
            resetter = (asyncio.ensure_future(reset_caches(fleet, regime.reset_every * fs.time_scale, resets))
                        if regime.reset_every > 0 else None)
            try:
                results, elapsed = await run_stage(launched.url + "/v1/chat/completions", plan, fs.time_scale,
                                                   request_timeout=max(60.0, 20 * duration * fs.time_scale),
                                                   stage_timeout=max(120.0, 6 * duration * fs.time_scale),
                                                   direct=direct)
            finally:
                if resetter is not None:
                    resetter.cancel()
            row = summarize(regime.name, router, qps, results, elapsed, len(resets))
            rows.append(row)
            print(f"  {router:15s} {regime.name:10s} qps={qps:<5g} n={row.requests:<5d} err={row.errors:<4d} "
                  f"ttft p50/p90={row.ttft_p50 or 0:.3f}/{row.ttft_p90 or 0:.3f}s out={row.output_tok_s:.0f} tok/s "
                  f"hit={100 * row.hit_rate:.1f}% wall={time.monotonic() - t0:.1f}s", flush=True)
            if row.error_sample:
                print(f"    first error: {row.error_sample}", flush=True)
        print(f"    fleet: {await _fleet_stats(fleet)}", flush=True)
    finally:
        if launched is not None:
            launched.stop()
        fleet_proc.stop()
    return rows


async def main_async(args: argparse.Namespace) -> int:
    fs = FleetSpec(servers=args.servers, time_scale=args.time_scale, kv_cache_size=args.kv_cache_size)
    all_regimes = regimes(fs)
    names = args.regimes.split(",") if args.regimes else (["fits", "pressure"] if args.quick else list(all_regimes))
    routers = args.routers.split(",") if args.routers else list(DEFAULT_ROUTERS)
    for n in names:
        if n not in all_regimes:
            print(f"unknown regime {n!r}; choose from {sorted(all_regimes)}", file=sys.stderr)
            return 2
    for r in routers:
        if r not in ROUTERS:
            print(f"unknown router {r!r}; choose from {sorted(ROUTERS)}", file=sys.stderr)
            return 2
    duration = args.duration or (15.0 if args.quick else 45.0)
    out_dir = Path(args.out)
    workdir = out_dir / "work"
    rows: list[Row] = []
    skipped: list[str] = []
    try:
        await _run_all(names, routers, all_regimes, args, fs, duration, workdir, rows, skipped)
    except asyncio.CancelledError:
        skipped.append("interrupted: the table holds the stages finished before the interrupt")
        _write(rows, skipped, fs, duration, out_dir)
        raise
    _write(rows, skipped, fs, duration, out_dir)
    return 0


async def _run_all(names: list[str], routers: list[str], all_regimes: dict[str, Regime], args: argparse.Namespace,
                   fs: FleetSpec, duration: float, workdir: Path, rows: list[Row], skipped: list[str]) -> None:
    for name in names:
        regime = all_regimes[name]
        if args.qps:
            regime = replace(regime, qps=tuple(float(q) for q in args.qps.split(",")))
        elif args.quick:
            regime = replace(regime, qps=regime.qps[:: max(1, len(regime.qps) - 1)][:2])
        s = regime.spec
        print(f"regime {name}: {s.num_groups} groups x {s.prompts_per_group}, system {s.system_prompt_len} tok, "
              f"question {s.question_len}, output {s.output_len}, zipf {s.zipf_s}; distinct prefixes "
              f"{s.distinct_prefix_tokens} tok = {100 * s.distinct_prefix_tokens / fs.cluster_tokens:.0f}% of "
              f"cluster KV; QPS {list(regime.qps)}", flush=True)
        for router in routers:
            try:
                rows += await run_one(router, regime, fs, duration, args.max_requests, workdir, args.seed)
            except Unavailable as exc:
                skipped.append(f"{router}: {exc}")
                print(f"  {router}: skipped ({exc})", flush=True)
            except RuntimeError as exc:
                skipped.append(f"{router}/{name}: failed: {str(exc)[:300]}")
                print(f"  {router}/{name}: FAILED {exc}", flush=True)


def _write(rows: list[Row], skipped: list[str], fs: FleetSpec, duration: float, out_dir: Path) -> None:
    header = (f"# Routing benchmark\n\nFleet: {fs.servers} modelsim servers x {fs.kv_cache_size} KV blocks of 16 "
              f"tokens, max-num-seqs {fs.max_num_seqs}, time scale {fs.time_scale}; stage duration {duration} "
              f"model s. Times in model seconds.\n")
    if skipped:
        header += "\nSkipped or failed:\n" + "\n".join(f"- {s}" for s in sorted(set(skipped))) + "\n"
    paths = write_outputs(rows, out_dir, header)
    print()
    print(markdown(rows, ""))
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run: fits+pressure, 2 QPS points, 15 s stages")
    ap.add_argument("--routers", help=f"comma list from {','.join(ROUTERS)} (default: all but oracle-proxy)")
    ap.add_argument("--regimes", help="comma list from fits,pressure,skew,no-sharing,outside-traffic,cache-resets "
                                      "(default: all)")
    ap.add_argument("--qps", help="comma list overriding every regime's QPS ladder (model time)")
    ap.add_argument("--duration", type=float, help="model seconds per QPS stage (default 45, quick 15)")
    ap.add_argument("--max-requests", type=int, default=3000, help="cap per stage (default 3000)")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kv-cache-size", type=int, default=1024)
    ap.add_argument("--time-scale", type=float, default=0.5, help="wall/model time (default 0.5 = 2x fast)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "routing"))
    args = ap.parse_args(argv)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # asyncio.run cancels the run; every fleet and router is stopped

    signal.signal(signal.SIGTERM, on_term)
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""One (router, regime, workload sample): a fresh modelsim fleet, the router in front of it, the regime's stages."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

import aiohttp

from bench.routing.agent import AgentWorkload
from bench.routing.agent_client import AgentRow, dump_calls, fill_pods, run_agent_stage, summarize_agent
from bench.routing.client import fill_engine_ttfts, run_stage
from bench.routing.procs import Proc, free_port_block, wait_http
from bench.routing.regimes import FleetSpec, Regime
from bench.routing.report import Row, summarize
from bench.routing.routers import Adapter, FleetInfo, Launched
from bench.routing.workload import Planned, Workload

MODEL = "meta-llama/Llama-3.1-8B"


def start_fleet(fs: FleetSpec, workdir: Path, name: str) -> tuple[Proc, FleetInfo]:
    base = free_port_block(fs.servers)
    kv_base = free_port_block(fs.servers)
    replay_base = free_port_block(fs.servers)
    oracle_port = free_port_block(1)
    argv = [sys.executable, "-m", "modelsim", "--servers", str(fs.servers), "--base-port", str(base),
            "--model", MODEL, "--time-scale", str(fs.time_scale), "--kv-cache-size", str(fs.kv_cache_size),
            "--max-num-seqs", str(fs.max_num_seqs), "--kv-events-port", str(kv_base),
            "--kv-events-replay-port", str(replay_base),
            "--stream-interval-ms", str(fs.stream_interval_ms), "--oracle-port", str(oracle_port),
            "--engine-type", fs.engine_type, "--metrics-time", fs.metrics_time]
    if fs.latency_factors:
        argv += ["--latency-factors", ",".join(f"{f:g}" for f in fs.latency_factors)]
    proc = Proc(f"modelsim-{name}", argv, workdir)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(fs.servers)]
    kv = [f"tcp://127.0.0.1:{kv_base + i}" for i in range(fs.servers)]
    replay = [f"tcp://127.0.0.1:{replay_base + i}" for i in range(fs.servers)]
    return proc, FleetInfo(urls, MODEL, kv, f"http://127.0.0.1:{oracle_port}", time_scale=fs.time_scale,
                           max_num_seqs=fs.max_num_seqs, kv_replay_endpoints=replay, engine_type=fs.engine_type)


async def fleet_stats(fleet: FleetInfo) -> str:
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


async def run_one(router: str, adapter: Adapter, regime: Regime, fs: FleetSpec, duration: float,
                  max_requests: int, workdir: Path, seed: int) -> list[Row] | list[AgentRow]:
    """Every stage of `regime` through `router` on workload sample `seed`, on a fresh fleet."""
    wd = workdir / f"{router}-{regime.name}-{seed}"
    wd.mkdir(parents=True, exist_ok=True)
    fleet_proc, fleet = start_fleet(fs, wd, regime.name)
    launched: Launched | None = None
    try:
        for u in fleet.urls:
            await wait_http(f"{u}/health", fleet_proc, 30.0)
        launched = await adapter(fleet, wd)
        if regime.agent is not None:
            rows: list[Row] | list[AgentRow] = await _agent_stages(router, launched, regime, fleet, fs, duration,
                                                                   seed)
        else:
            rows = await _request_stages(router, launched, regime, fleet, fs, duration, max_requests, seed)
        print(f"    fleet: {await fleet_stats(fleet)}", flush=True)
    finally:
        if launched is not None:
            launched.stop()
        fleet_proc.stop()
    return rows


def _slo_headers(regime: Regime, router: str) -> str:
    """The SLO header names `router`'s requests carry in `regime` ("none" for a router the regime strips them for)."""
    return "none" if router in regime.slo_strip else regime.slo_headers


async def _request_stages(router: str, launched: Launched, regime: Regime, fleet: FleetInfo, fs: FleetSpec,
                          duration: float, max_requests: int, seed: int) -> list[Row]:
    wl = Workload(regime.spec, MODEL, seed)
    rows: list[Row] = []
    if regime.warmup:
        await run_stage(launched.url + "/v1/chat/completions", wl.warmup(8.0), fs.time_scale,
                        request_timeout=60.0, stage_timeout=120.0)
    for i, qps in enumerate(regime.qps):
        plan = wl.plan(qps, duration, max_requests, stage_seed=i, slo=regime.slo)
        direct = outside_plan(plan, fleet.urls, regime.outside, f"{seed}/outside/{i}/{qps}")
        t0 = time.monotonic()
        resets: list[int] = []
        resetter = (asyncio.ensure_future(reset_caches(fleet, regime.reset_every * fs.time_scale, resets))
                    if regime.reset_every > 0 else None)
        try:
            results, elapsed = await run_stage(launched.url + "/v1/chat/completions", plan, fs.time_scale,
                                               request_timeout=max(60.0, 20 * duration * fs.time_scale),
                                               stage_timeout=max(120.0, 6 * duration * fs.time_scale),
                                               direct=direct, slo_headers=_slo_headers(regime, router))
        finally:
            if resetter is not None:
                resetter.cancel()
        await fill_engine_ttfts(results, fleet.urls)
        row = summarize(regime.name, router, qps, results, elapsed, len(resets), seed)
        rows.append(row)
        extra = ""
        if row.hop_p50 is not None:
            extra += f" hop p50/p90={1e3 * row.hop_p50:.1f}/{1e3 * (row.hop_p90 or 0):.1f}ms"
        if row.direct:
            extra += f" all p90={row.ttft_p90_all or 0:.3f}s direct={row.direct}"
        if row.slo_requests:
            extra += (f" slo tight/all={100 * (row.slo_attain_tight or 0):.0f}%/"
                      f"{100 * (row.slo_attain_all or 0):.0f}% goodput={row.goodput or 0:.2f}/s "
                      f"tight/loose p90={row.ttft_p90_tight or 0:.3f}/{row.ttft_p90_loose or 0:.3f}s")
        print(f"  {router:15s} {regime.name:10s} s{seed} qps={qps:<5g} n={row.requests:<5d} err={row.errors:<4d} "
              f"ttft p50/p90={row.ttft_p50 or 0:.3f}/{row.ttft_p90 or 0:.3f}s out={row.output_tok_s:.0f} tok/s "
              f"hit={100 * row.hit_rate:.1f}%{extra} wall={time.monotonic() - t0:.1f}s", flush=True)
        if row.error_sample:
            print(f"    first error: {row.error_sample}", flush=True)
    return rows


async def _agent_stages(router: str, launched: Launched, regime: Regime, fleet: FleetInfo, fs: FleetSpec,
                        duration: float, seed: int) -> list[AgentRow]:
    assert regime.agent is not None
    wl = AgentWorkload(regime.agent, MODEL, seed)
    spec = regime.agent
    rows: list[AgentRow] = []
    for i, conc in enumerate(regime.qps):
        n = regime.sessions or 2 * int(conc)
        # a session lasts about turns × (pause + a turn); allow several times the closed loop's expected length
        expected = (n / conc + 1) * (spec.turns + spec.turns_spread) * (spec.pause_mean + 3.0)
        t0 = time.monotonic()
        results, elapsed = await run_agent_stage(launched.url + "/v1/chat/completions", wl, int(conc), n,
                                                 fs.time_scale, stage=i,
                                                 request_timeout=max(60.0, 20 * duration * fs.time_scale),
                                                 stage_timeout=max(120.0, 4 * expected * fs.time_scale))
        await fill_pods(results, fleet.urls)
        dump_calls(results, router, seed, i)
        row = summarize_agent(regime.name, router, int(conc), results, elapsed, seed, wl)
        rows.append(row)
        stayed = "-" if row.stayed is None else f"{100 * row.stayed:.0f}%"
        print(f"  {router:15s} {regime.name:10s} s{seed} sessions={conc:g}x{n} done={row.finished} "
              f"reqs={row.requests} err={row.errors} ttft first/later p90={row.ttft_first_p90 or 0:.3f}/"
              f"{row.ttft_later_p90 or 0:.3f}s session p50/p90={row.session_p50 or 0:.1f}/"
              f"{row.session_p90 or 0:.1f}s stayed={stayed} hit={100 * row.hit_rate:.1f}% "
              f"wall={time.monotonic() - t0:.1f}s", flush=True)
        if row.error_sample:
            print(f"    first error: {row.error_sample}", flush=True)
    return rows

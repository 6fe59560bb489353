"""A tiny run of the routing benchmark's pieces that need no external router: the workload generator,
the SSE client and report against an in-process fleet, directly and through the oracle proxy."""

from __future__ import annotations

from aiohttp import web

from bench.routing.client import fill_engine_ttfts, run_stage
from bench.routing.oracle import build_app
from bench.routing.report import markdown, summarize
from bench.routing.workload import Workload, WorkloadSpec
from epp.stack.ports import free_port_block
from modelsim.config import EngineConfig

MODEL = "meta-llama/Llama-3.1-8B"
SCALE = 0.1


def test_workload_plan_is_seeded_poisson_and_shares_prefixes() -> None:
    spec = WorkloadSpec(num_groups=3, prompts_per_group=2, system_prompt_len=64, question_len=8, output_len=4)
    wl = Workload(spec, MODEL, seed=1)
    a = wl.plan(20, 5.0, 1000)
    assert [p.at for p in a] == [p.at for p in Workload(spec, MODEL, seed=1).plan(20, 5.0, 1000)]
    assert 50 <= len(a) <= 150 and all(0 < p.at <= 5.0 for p in a)
    sys0 = wl.body(0, 0)["messages"][0]["content"]
    assert len(sys0) == 4 * 64 and sys0 == wl.body(0, 1)["messages"][0]["content"]
    assert sys0 != wl.body(1, 0)["messages"][0]["content"]
    zipf = Workload(WorkloadSpec(num_groups=10, zipf_s=1.2), MODEL).plan(50, 10.0, 400)
    counts = [sum(1 for p in zipf if p.group == g) for g in range(10)]
    assert counts[0] > counts[9]


async def test_direct_and_oracle_smoke(make_fleet) -> None:
    fleet = await make_fleet(2, time_scale=SCALE, engine=EngineConfig(kv_cache_size=256),
                             oracle_port=free_port_block(1))
    spec = WorkloadSpec(num_groups=4, prompts_per_group=3, system_prompt_len=256, question_len=16, output_len=8)
    plan = Workload(spec, MODEL, seed=0).plan(20, 3.0, 80)
    results, elapsed = await run_stage(fleet.urls[0] + "/v1/chat/completions", plan, SCALE, 10.0, 15.0)
    await fill_engine_ttfts(results, fleet.urls)
    direct = summarize("smoke", "direct", 20, results, elapsed)
    assert direct.errors == 0 and direct.requests == len(plan)
    assert direct.hit_rate > 0.5 and direct.ttft_p50 is not None and direct.output_tok_s > 0
    # every request found in its engine's own records, which saw its first token no later than the client did
    assert len({r.request_id for r in results}) == len(results)
    assert all(r.engine_ttft is not None and 0 <= r.engine_ttft <= r.ttft + 0.01 for r in results if r.ttft)
    assert direct.engine_ttft_p50 is not None and direct.engine_ttft_p50 <= direct.ttft_p50
    assert direct.hop_p50 is not None and direct.hop_p50 >= -0.01

    port = free_port_block(1)
    runner = web.AppRunner(build_app(fleet.urls))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        results, elapsed = await run_stage(f"http://127.0.0.1:{port}/v1/chat/completions", plan, SCALE, 10.0, 15.0)
    finally:
        await runner.cleanup()
    proxy = summarize("smoke", "oracle-proxy", 20, results, elapsed)
    assert proxy.errors == 0 and proxy.hit_rate > 0.5
    assert {r.pod for r in results} <= {"modelsim-0", "modelsim-1"}

    results, elapsed = await run_stage(fleet.oracle_url + "/v1/chat/completions", plan, SCALE, 10.0, 15.0)
    oracle = summarize("smoke", "oracle", 20, results, elapsed)
    assert oracle.errors == 0 and oracle.hit_rate > 0.5
    table = markdown([direct, proxy, oracle])
    assert "| smoke | oracle | 20 |" in table
    assert "Where the TTFT was spent" in table and "| smoke | direct | 0 | 20 |" in table  # only the direct row
    assert "| smoke | oracle | 0 | 20 | " not in table.split("Where the TTFT was spent")[1]

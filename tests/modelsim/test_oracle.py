"""The in-process oracle router on a real fleet: its cost pick, and its TTFT-SLO pick (header in wall ms)."""

from __future__ import annotations

import aiohttp

from bench.routing.procs import free_port_block
from modelsim.engine import SimRequest
from modelsim.oracle import OracleRouter, slo_seconds

MODEL = "meta-llama/Llama-3.1-8B"
SYSTEM = "You are a careful assistant. " * 300  # ~2,200 tokens with the JSON framing


def body(question: str, max_tokens: int = 200) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


def test_slo_header_parsing() -> None:
    assert slo_seconds({"x-llm-d-slo-ttft-ms": "250"}, 1.0) == 0.25
    assert slo_seconds({"x-slo-ttft-ms": "100"}, 0.5) == 0.2  # wall ms at time scale 0.5: 0.2 model s
    assert slo_seconds({"x-llm-d-slo-ttft-ms": "soon", "x-slo-ttft-ms": "50"}, 1.0) == 0.05
    assert slo_seconds({"x-llm-d-slo-ttft-ms": "-3"}, 1.0) is None
    assert slo_seconds({}, 1.0) is None


async def test_slo_pick_prefers_a_warm_busy_server_to_a_cold_idle_one(make_fleet) -> None:
    scale = 0.05  # the busy requests below run for ~2 s of wall time, the picks take milliseconds
    fleet = await make_fleet(2, time_scale=scale, oracle_port=free_port_block(1))
    warm, cold = fleet.servers
    assert warm.driver is not None
    for i in range(15):  # the warm server holds the system prompt and runs 15 requests (load ~1.93)
        tokens = warm.request_tokens("chat", body(f"busy {i}"))
        warm.driver.submit(SimRequest(f"r{i}", tokens, 2000))
    oracle = OracleRouter(fleet.servers)
    b = body("the new question")
    # no SLO: the idle server costs less overall (its decode is twice as fast) despite the cold prefill
    assert oracle.choose("chat", b) is cold
    # a 250 ms TTFT SLO only the warm server meets (a cold ~2,200-token prefill takes ~0.58 s)
    assert oracle.choose("chat", b, slo=0.25) is warm
    # an SLO nobody meets: the least predicted TTFT
    assert oracle.choose("chat", b, slo=0.001) is warm
    # a loose SLO both meet: back to the cheapest
    assert oracle.choose("chat", b, slo=5.0) is cold
    async with aiohttp.ClientSession() as s:
        url = f"{fleet.oracle_url}/v1/chat/completions"
        # the header is in wall milliseconds: 250 model ms at this time scale
        async with s.post(url, json=body("over http"), headers={"x-llm-d-slo-ttft-ms": str(250 * scale)}) as r:
            assert r.status == 200 and r.headers["x-inference-pod"] == warm.pod
        async with s.post(url, json=body("over http, no SLO")) as r:
            assert r.status == 200 and r.headers["x-inference-pod"] == cold.pod

"""The HTTP layer against a real in-process fleet (fast time scale)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"


def chat(content: str, max_tokens: int = 4, stream: bool = False, model: str = MODEL) -> dict:
    body = {"model": model, "messages": [{"role": "system", "content": "S" * 640},
                                         {"role": "user", "content": content}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def test_stream_usage_cached_tokens_and_headers(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        usages = []
        for q in ("first question", "second question"):
            async with s.post(f"{url}/v1/chat/completions", json=chat(q, 5, stream=True)) as r:
                assert r.status == 200
                assert r.headers["x-inference-pod"] == "modelsim-0"
                assert r.headers["x-inference-port"] == str(fleet.servers[0].port)
                raw = (await r.read()).decode()
            events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [orjson.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
            assert len(text) == 20
            usages.append(chunks[-1]["usage"])
        assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
        # The 640-char system prompt plus the JSON framing: at least 10 shared 64-byte blocks.
        assert usages[1]["prompt_tokens_details"]["cached_tokens"] >= 160
        assert usages[1]["completion_tokens"] == 5


async def test_metrics_parse_with_prometheus_client(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05, loras=("ad1",))
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        for q in ("a", "b"):
            async with s.post(f"{url}/v1/chat/completions", json=chat(q)) as r:
                assert r.status == 200
        async with s.post(f"{url}/v1/chat/completions", json=chat("c", model="ad1")) as r:
            assert r.status == 200
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:cache_config_info", "vllm:lora_requests_info", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert name in fams, name
    info = fams["vllm:cache_config_info"].samples[0]
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "1024" and info.value == 1
    lora = fams["vllm:lora_requests_info"].samples[0]
    assert lora.labels["max_lora"] == "1" and lora.value > 1.6e9
    hits = [s for s in fams["vllm:prefix_cache_hits"].samples if s.name.endswith("_total")][0]
    assert hits.value > 0 and hits.labels["model_name"] == MODEL
    ttft_count = [s for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")][0]
    assert ttft_count.value == 3


async def test_prefix_hit_cuts_ttft_over_http(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    body = {"model": MODEL, "prompt": "p" * 6400 + "x", "max_tokens": 1, "ignore_eos": True}
    body2 = {**body, "prompt": "p" * 6400 + "y"}
    async with aiohttp.ClientSession() as s:
        for b in (body, body2):
            async with s.post(f"{url}/v1/completions", json=b) as r:
                assert r.status == 200
    ttft = fleet.servers[0].metrics.ttft.labels(MODEL, "0")
    # sum of the two TTFTs: (0.03 + 1601 × 250 µs) + (0.03 + 1 × 250 µs)
    assert ttft._sum.get() == pytest.approx(0.06 + 1602 * 0.00025)


async def test_errors_lora_and_admin(make_fleet) -> None:
    fleet = await make_fleet(2, time_scale=0.05)
    u0, u1 = fleet.urls
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{u0}/v1/chat/completions", json=chat("x"), headers={"X-Return-Error": "503"}) as r:
            assert r.status == 503
        async with s.post(f"{u0}/v1/chat/completions", json=chat("x", model="nope")) as r:
            assert r.status == 404
        async with s.post(f"{u0}/v1/load_lora_adapter", json={"lora_name": "l1", "lora_path": "/x"}) as r:
            assert r.status == 200
        async with s.get(f"{u0}/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL, "l1"]
        async with s.post(f"{u0}/admin/probe?api=chat", json=chat("x")) as r:
            probe = await r.json()
            assert probe["cached_tokens"] == 0 and probe["prompt_tokens"] > 160
        async with s.post(f"{u1}/admin/fleet/probe?api=chat", json=chat("x")) as r:
            servers = (await r.json())["servers"]
            assert [x["url"] for x in servers] == [u0, u1]
        # hang: a request blocks until recover
        async with s.post(f"{u1}/admin/hang") as r:
            assert r.status == 200
        pending = asyncio.ensure_future(s.get(f"{u1}/health"))
        # A window in which nothing may happen: the request stays unanswered (a local one is answered in a few ms).
        done, _ = await asyncio.wait({pending}, timeout=0.1)
        assert not done
        async with s.post(f"{u1}/admin/recover") as r:
            assert r.status == 200
        resp = await asyncio.wait_for(pending, 2)
        assert resp.status == 200
        resp.release()
        # kill for 0.3 s: connection refused, then back
        async with s.post(f"{u1}/admin/kill?seconds=0.3") as r:
            assert r.status == 200
        killed = time.monotonic()

        async def health_is(want: int | None) -> bool:  # None: the connection fails
            try:
                async with s.get(f"{u1}/health") as r:
                    return r.status == want
            except aiohttp.ClientConnectionError:
                return want is None

        await until(lambda: health_is(None), 5, "the killed server to refuse connections")
        await until(lambda: health_is(200), 5, "the killed server to answer again")
        assert time.monotonic() - killed >= 0.3  # not before its 0.3 s


async def test_anthropic_stream_and_pd(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "system": "sys", "max_tokens": 3, "stream": True,
                "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
        async with s.post(f"{url}/v1/messages", json=body) as r:
            raw = (await r.read()).decode()
        names = [line[7:] for line in raw.split("\n") if line.startswith("event: ")]
        assert names[0] == "message_start" and names[-1] == "message_stop"
        before = fleet.servers[0].metrics.ttft.labels(MODEL, "0")._sum.get()
        pbody = {"model": MODEL, "prompt": "q" * 400, "max_tokens": 50,
                 "kv_transfer_params": {"do_remote_decode": True}}
        async with s.post(f"{url}/v1/completions", json=pbody) as r:
            out = await r.json()
        assert out["choices"][0]["finish_reason"] == "remote_decode"
        assert out["usage"]["completion_tokens"] == 1
        assert out["kv_transfer_params"]["do_remote_prefill"] is True
        dbody = {"model": MODEL, "prompt": "d" * 4000, "max_tokens": 1, "ignore_eos": True}
        async with s.post(f"{url}/v1/completions", json=dbody, headers={"x-prefiller-host-port": "h:1"}) as r:
            assert r.status == 200
    ttft = fleet.servers[0].metrics.ttft.labels(MODEL, "0")._sum.get() - before
    # the prefill request (100 tokens) plus the decode one: transfer 5 ms + 1000 x 10 us instead of 280 ms
    assert ttft == pytest.approx((0.03 + 100 * 0.00025) + (0.005 + 1000 * 0.00001))


async def test_queue_full_returns_429(make_fleet) -> None:
    from modelsim.config import EngineConfig

    fleet = await make_fleet(1, time_scale=0.05, engine=EngineConfig(max_num_seqs=1, max_waiting=1))
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        reqs = [s.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": f"p{i}", "max_tokens": 20,
                                                      "ignore_eos": True}) for i in range(3)]
        resps = await asyncio.gather(*reqs)
        statuses = sorted(r.status for r in resps)
        for r in resps:
            r.release()
    assert statuses == [200, 200, 429]

"""modelsim's engine metrics against its own request records: vLLM and SGLang names, types, labels and buckets,
values observed when the simulated events happen, wall-clock histograms, and heterogeneous fleets."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelsim.config import EngineConfig, FleetConfig
from modelsim.metrics import (
    SGLANG_E2E_BUCKETS,
    SGLANG_ITL_BUCKETS,
    SGLANG_QUEUE_BUCKETS,
    SGLANG_TTFT_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_REQUEST_BUCKETS,
    VLLM_TTFT_BUCKETS,
)
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"

# vLLM histogram -> (record field, buckets); every one observed once per finished request
VLLM_PER_REQUEST = {
    "vllm:time_to_first_token_seconds": ("ttft", VLLM_TTFT_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("e2e", VLLM_REQUEST_BUCKETS),
    "vllm:request_queue_time_seconds": ("queue", VLLM_REQUEST_BUCKETS),
    "vllm:request_prefill_time_seconds": ("prefill", VLLM_REQUEST_BUCKETS),
    "vllm:request_decode_time_seconds": ("decode", VLLM_REQUEST_BUCKETS),
    "vllm:request_inference_time_seconds": ("inference", VLLM_REQUEST_BUCKETS),
    "vllm:request_time_per_output_token_seconds": ("tpot", VLLM_ITL_BUCKETS),
}


def completion(prompt: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}


async def scrape(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(f"{url}/metrics") as r:
        assert r.status == 200
        return {f.name: f for f in text_string_to_metric_families(await r.text())}


async def records(s: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with s.get(f"{url}/admin/requests") as r:
        return (await r.json())["records"]


def histogram(fam: Any) -> tuple[dict[float, float], float, float, dict[str, str]]:
    """(cumulative bucket counts by upper bound, sum, count, the labels minus `le`) of a one-series histogram."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    labels: dict[str, str] = {}
    for smp in fam.samples:
        if smp.name.endswith("_bucket"):
            buckets[float(smp.labels["le"])] = smp.value
            labels = {k: v for k, v in smp.labels.items() if k != "le"}
        elif smp.name.endswith("_sum"):
            total = smp.value
        elif smp.name.endswith("_count"):
            count = smp.value
    return buckets, total, count, labels


def counter(fams: dict[str, Any], name: str) -> float:
    return sum(s.value for s in fams[name].samples if s.name.endswith("_total"))


def check_against(fam: Any, values: list[float], bounds: tuple[float, ...], labels: dict[str, str]) -> None:
    """The histogram is exactly the distribution of `values`: bucket bounds, counts, sum and labels."""
    buckets, total, count, got_labels = histogram(fam)
    assert fam.type == "histogram"
    assert got_labels == labels
    assert sorted(buckets) == [*bounds, float("inf")]
    assert count == len(values) and total == pytest.approx(sum(values), rel=1e-9, abs=1e-12)
    for le, n in buckets.items():
        assert n == sum(1 for v in values if v <= le), (fam.name, le)


async def test_vllm_histograms_and_counters_match_the_simulated_timings(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.02, engine=EngineConfig(max_num_seqs=2))
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        # a cold 1601-token prompt, then one sharing its first 1600 tokens, then three at once (one queues)
        for prompt in ("p" * 6400 + "x", "p" * 6400 + "y"):
            async with s.post(f"{url}/v1/completions", json=completion(prompt, 5)) as r:
                assert r.status == 200
        burst = [s.post(f"{url}/v1/completions", json=completion(f"q{i}" * 300, 4 + i)) for i in range(3)]
        for r in await asyncio.gather(*burst):
            assert r.status == 200
            r.release()
        recs = await records(s, url)
        fams = await scrape(s, url)
    assert len(recs) == 5 and all(r["finish_reason"] == "length" for r in recs)
    cold, warm = recs[0], recs[1]
    assert cold["ttft"] == pytest.approx(0.03 + 1601 * 0.00025) and cold["cached_tokens"] == 0
    assert warm["ttft"] == pytest.approx(0.03 + 1 * 0.00025) and warm["cached_tokens"] == 1600
    assert cold["decode"] == pytest.approx(4 * 0.012) and cold["tpot"] == pytest.approx(0.012)
    assert max(r["queue"] for r in recs) > 0  # the third of the burst waited for a slot
    labels = {"model_name": MODEL, "engine": "0"}
    for name, (field, bounds) in VLLM_PER_REQUEST.items():
        check_against(fams[name], [r[field] for r in recs], bounds, labels)
    # inter-token latency: one observation per token after the first, each 12 ms × the load (≤ 2 running: < 25 ms)
    buckets, total, count, got = histogram(fams["vllm:inter_token_latency_seconds"])
    assert got == labels and sorted(buckets) == [*VLLM_ITL_BUCKETS, float("inf")]
    assert count == sum(r["itl_count"] for r in recs) == sum(r["output_tokens"] - 1 for r in recs)
    assert total == pytest.approx(sum(r["itl_sum"] for r in recs))
    assert buckets[0.01] == 0 and buckets[0.025] == count
    assert counter(fams, "vllm:prefix_cache_queries") == sum(r["prompt_tokens"] for r in recs)
    assert counter(fams, "vllm:prefix_cache_hits") == sum(r["cached_tokens"] for r in recs) >= 1600
    assert counter(fams, "vllm:prompt_tokens") == sum(r["prompt_tokens"] for r in recs)
    assert counter(fams, "vllm:generation_tokens") == sum(r["output_tokens"] for r in recs)
    for gauge in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert fams[gauge].type == "gauge"


async def test_ttft_is_observed_at_the_first_token_not_at_the_end(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json=completion("hello " * 40, 2000, stream=True)) as r:
            assert r.status == 200
            await r.content.readany()  # the first token is out; 2000 tokens take ~1.2 s of wall time
            fams = await scrape(s, url)
        # leaving the block closed the connection: the request is aborted, and recorded as such
        await until(lambda: _has_records(s, url, 1), 5.0)
        recs = await records(s, url)
    assert histogram(fams["vllm:time_to_first_token_seconds"])[2] == 1
    assert histogram(fams["vllm:e2e_request_latency_seconds"])[2] == 0
    assert recs[0]["finish_reason"] == "abort" and recs[0]["ttft"] is not None


async def _has_records(s: aiohttp.ClientSession, url: str, n: int) -> bool:
    return len(await records(s, url)) >= n


async def test_wall_clock_histograms_are_model_times_scaled(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05, metrics_time="wall")
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json=completion("w" * 4000, 3)) as r:
            assert r.status == 200
        recs = await records(s, url)
        fams = await scrape(s, url)
        async with s.get(f"{url}/admin/state") as r:
            state = await r.json()
    assert state["metrics_time"] == "wall" and state["time_scale"] == 0.05
    _, total, count, _ = histogram(fams["vllm:time_to_first_token_seconds"])
    assert count == 1 and total == pytest.approx(0.05 * recs[0]["ttft"]) and recs[0]["ttft"] > 0.25


async def test_sglang_flavour_names_values_and_flush_cache(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.02, engine_type="sglang")
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        for prompt in ("s" * 6400 + "1", "s" * 6400 + "2", "t" * 800):
            async with s.post(f"{url}/v1/completions", json=completion(prompt, 6)) as r:
                assert r.status == 200
        recs = await records(s, url)
        fams = await scrape(s, url)
        assert not [n for n in fams if n.startswith("vllm:")]
        labels = {"model_name": MODEL}
        check_against(fams["sglang:time_to_first_token_seconds"], [r["ttft"] for r in recs], SGLANG_TTFT_BUCKETS,
                      labels)
        check_against(fams["sglang:e2e_request_latency_seconds"], [r["e2e"] for r in recs], SGLANG_E2E_BUCKETS,
                      labels)
        check_against(fams["sglang:queue_time_seconds"], [r["queue"] for r in recs], SGLANG_QUEUE_BUCKETS, labels)
        buckets, total, count, _ = histogram(fams["sglang:inter_token_latency_seconds"])
        assert sorted(buckets) == [*SGLANG_ITL_BUCKETS, float("inf")] and count == 15
        assert total == pytest.approx(15 * 0.012)
        assert counter(fams, "sglang:prompt_tokens") == sum(r["prompt_tokens"] for r in recs)
        assert counter(fams, "sglang:cached_tokens") == sum(r["cached_tokens"] for r in recs) >= 1600
        assert counter(fams, "sglang:generation_tokens") == 18 and counter(fams, "sglang:num_requests") == 3
        hit_rate = fams["sglang:cache_hit_rate"].samples[0].value
        assert hit_rate == pytest.approx(sum(r["cached_tokens"] for r in recs) / sum(r["prompt_tokens"] for r in recs))
        assert fams["sglang:max_total_num_tokens"].samples[0].value == 1024 * 16
        for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                      "sglang:gen_throughput", "sglang:num_used_tokens"):
            assert fams[gauge].type == "gauge" and fams[gauge].samples[0].labels == labels
        info = fams["sglang:cache_config_info"].samples[0].labels
        assert info == {"page_size": "16", "num_pages": "1024"}

        # /flush_cache: refused while a request runs, then it empties the prefix cache
        async with s.post(f"{url}/v1/completions", json=completion("u" * 400, 3000, stream=True)) as r:
            await r.content.readany()
            async with s.post(f"{url}/flush_cache") as f:
                assert f.status == 400
        await until(lambda: _idle(s, url), 5.0)
        fams = await scrape(s, url)
        assert counter(fams, "sglang:num_aborted_requests") == 1
        async with s.post(f"{url}/flush_cache") as f:
            assert f.status == 200
        async with s.post(f"{url}/v1/completions", json=completion("s" * 6400 + "3", 2)) as r:
            assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def _idle(s: aiohttp.ClientSession, url: str) -> bool:
    async with s.get(f"{url}/admin/state") as r:
        st = await r.json()
    return st["running"] == 0 and st["waiting"] == 0


async def test_vllm_flavour_has_no_flush_cache(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    async with aiohttp.ClientSession() as s, s.post(f"{fleet.urls[0]}/flush_cache") as r:
        assert r.status in (404, 405)


async def test_latency_factors_slow_a_server_down_exactly(make_fleet) -> None:
    fleet = await make_fleet(2, time_scale=0.02, latency_factors=(1.0, 2.0))
    async with aiohttp.ClientSession() as s:
        for url in fleet.urls:
            async with s.post(f"{url}/v1/completions", json=completion("h" * 4000, 4)) as r:
                assert r.status == 200
        fast, slow = [(await records(s, u))[0] for u in fleet.urls]
        async with s.get(f"{fleet.urls[1]}/admin/state") as r:
            state = await r.json()
    assert slow["ttft"] == pytest.approx(2 * fast["ttft"]) and slow["decode"] == pytest.approx(2 * fast["decode"])
    assert state["latency_factor"] == 2.0 and state["itl"] == pytest.approx(0.024)
    assert state["prefill_per_token"] == pytest.approx(0.0005)


def test_fleet_config_rejects_bad_heterogeneity_and_flavours() -> None:
    with pytest.raises(ValueError, match="latency_factors lists 1"):
        FleetConfig(servers=2, latency_factors=(1.0,))
    with pytest.raises(ValueError, match="must all be > 0"):
        FleetConfig(servers=2, latency_factors=(1.0, 0.0))
    with pytest.raises(ValueError, match="engine_type"):
        FleetConfig(engine_type="tgi")
    with pytest.raises(ValueError, match="metrics_time"):
        FleetConfig(metrics_time="gpu")
    cfg = FleetConfig(servers=2, latency_factors=(1.0, 3.0))
    assert cfg.engine_for(0) is cfg.engine and cfg.engine_for(1).prefill_overhead == pytest.approx(0.09)


async def test_request_log_is_bounded_and_pages_with_since(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.02, request_log_size=3)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        for i in range(5):
            async with s.post(f"{url}/v1/completions", json=completion(f"r{i}", 1),
                               headers={"x-request-id": f"req-{i}"}) as r:
                assert r.status == 200
        async with s.get(f"{url}/admin/requests?since=3") as r:
            page = await r.json()
        async with s.get(f"{url}/admin/requests?since=x") as r:
            assert r.status == 400
        recs = await records(s, url)
    assert [r["request_id"] for r in recs] == ["req-2", "req-3", "req-4"]
    assert page["last"] == 5 and [r["seq"] for r in page["records"]] == [4, 5]

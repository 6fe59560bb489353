"""Engine latency for least-latency: histogram totals in the exposition, period means between scrapes."""

from __future__ import annotations

import pytest

from epp.fleet.scrape.parser import parse_sglang, parse_vllm
from epp.fleet.scrape.scraper import period_latency


def vllm(ttft_sum: float, ttft_n: int, itl_sum: float, itl_n: int, itl_name: str = "inter_token_latency") -> bytes:
    return (
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="1.0",model_name="m",engine="0"}} {ttft_n}\n'
        f'vllm:time_to_first_token_seconds_sum{{model_name="m",engine="0"}} {ttft_sum / 2}\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="m",engine="0"}} {ttft_n // 2}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="1.0",model_name="m",engine="1"}} {ttft_n}\n'
        f'vllm:time_to_first_token_seconds_sum{{model_name="m",engine="1"}} {ttft_sum / 2}\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="m",engine="1"}} {ttft_n - ttft_n // 2}\n'
        f"# TYPE vllm:{itl_name}_seconds histogram\n"
        f'vllm:{itl_name}_seconds_sum{{model_name="m"}} {itl_sum}\n'
        f'vllm:{itl_name}_seconds_count{{model_name="m"}} {itl_n}\n'
    ).encode()


def test_histogram_totals_are_summed_over_series():
    m = parse_vllm(vllm(3.0, 10, 0.5, 100), 1.0)
    assert m.latency_totals == pytest.approx((3.0, 10, 0.5, 100))
    old_name = parse_vllm(vllm(3.0, 10, 0.5, 100, "time_per_output_token"), 1.0)
    assert old_name.latency_totals == pytest.approx((3.0, 10, 0.5, 100))
    assert parse_vllm(b"vllm:num_requests_waiting 0\n", 1.0).latency_totals is None
    sg = parse_sglang(b"sglang:num_queue_reqs 0\nsglang:time_to_first_token_seconds_sum 2\n"
                      b"sglang:time_to_first_token_seconds_count 4\n", 1.0)
    assert sg.latency_totals == (2.0, 4.0, 0.0, 0.0)


def test_period_means_from_consecutive_scrapes():
    first = period_latency(parse_vllm(vllm(3.0, 10, 0.5, 100), 1.0), None)
    assert first.ttft_s is None and first.tpot_s is None  # one scrape: no period yet
    second = period_latency(parse_vllm(vllm(5.0, 14, 1.5, 150), 2.0), first)
    assert second.ttft_s == pytest.approx(0.5) and second.tpot_s == pytest.approx(0.02)
    quiet = period_latency(parse_vllm(vllm(5.0, 14, 1.5, 150), 3.0), second)
    assert quiet.ttft_s == pytest.approx(0.5)  # nothing finished: the last means stay
    restarted = period_latency(parse_vllm(vllm(0.1, 1, 0.0, 0), 4.0), quiet)
    assert restarted.ttft_s is None  # counters went back: start over


def test_engine_totals_for_the_timing_fit_and_the_prefix_trust():
    text = (
        b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
        b"# TYPE vllm:time_to_first_token_seconds histogram\n"
        b'vllm:time_to_first_token_seconds_bucket{le="0.1",engine="0"} 3\n'
        b'vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0"} 4\n'
        b'vllm:time_to_first_token_seconds_count{engine="0"} 4\n'
        b'vllm:time_to_first_token_seconds_sum{engine="0"} 0.5\n'
        b'vllm:time_to_first_token_seconds_bucket{le="0.1",engine="1"} 1\n'
        b'vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="1"} 1\n'
        b'vllm:time_to_first_token_seconds_count{engine="1"} 1\n'
        b'vllm:time_to_first_token_seconds_sum{engine="1"} 0.05\n'
        b"# TYPE vllm:request_prefill_time_seconds histogram\n"
        b"vllm:request_prefill_time_seconds_sum 0.4\nvllm:request_prefill_time_seconds_count 5\n"
        b"# TYPE vllm:request_decode_time_seconds histogram\n"
        b"vllm:request_decode_time_seconds_sum 2.0\nvllm:request_decode_time_seconds_count 5\n"
        b"# TYPE vllm:prefix_cache_queries counter\n"
        b'vllm:prefix_cache_queries_total{engine="0"} 800\nvllm:prefix_cache_queries_total{engine="1"} 200\n'
        b"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 640\n"
    )
    e = parse_vllm(text, 1.0).engine
    assert e is not None
    assert e.ttft == pytest.approx((0.55, 5)) and e.requests == 5 and e.counted_at == "admission"
    assert e.ttft_buckets == ((0.1, 4.0), (float("inf"), 5.0))  # summed over the engines, by bound
    assert e.prefill == pytest.approx((0.4, 5)) and e.decode == pytest.approx((2.0, 5)) and e.itl is None
    assert (e.prompt_tokens, e.cached_tokens) == (1000, 640)
    sg = parse_sglang(b"sglang:num_queue_reqs 0\nsglang:time_to_first_token_seconds_sum 2\n"
                      b"sglang:time_to_first_token_seconds_count 4\nsglang:prompt_tokens_total 900\n"
                      b"sglang:cached_tokens_total 300\nsglang:num_requests_total 3\n"
                      b"sglang:generation_tokens_total 60\n", 1.0).engine
    assert sg is not None and sg.counted_at == "end"
    assert (sg.prompt_tokens, sg.cached_tokens, sg.requests, sg.generation_tokens) == (900, 300, 3, 60)
    assert parse_vllm(b"vllm:num_requests_waiting 0\n", 1.0).engine is None  # no histograms: nothing to fit

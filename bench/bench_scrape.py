"""Benchmark: the hand-written /metrics parser against prometheus_client's text parser.

Run:  python bench/bench_scrape.py [--repeat 7] [--number 300]

For each exposition (realistic vLLM/SGLang/TRT-LLM text from tests/scrape/expositions.py) it times:
  fast  epp.scrape.parser.parse_metrics(body_bytes, engine, now)   (what the scraper runs)
  prom  prometheus_client.parser.text_string_to_metric_families(body.decode()) walked to extract the same values
and prints the median µs per exposition, the ratio, and the share of one core the fast parser needs to keep up
with 512 endpoints scraped every 50 ms (10,240 expositions/s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "scrape"))

from expositions import (  # noqa: E402
    sglang_exposition,
    triton_exposition,
    trtllm_exposition,
    vllm_exposition,
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from epp.scrape.parser import parse_metrics  # noqa: E402

ENDPOINTS, INTERVAL = 512, 0.05
WANTED = {
    "vllm": {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
             "vllm:cache_config_info", "vllm:lora_requests_info"},
    "sglang": {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info"},
    "trtllm-serve": {"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization",
                     "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_max_blocks"},
    "triton": {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"},
}


def prom_extract(body: bytes, engine: str) -> dict[str, list]:
    wanted = WANTED[engine]
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name in wanted:
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def timeit(fn, number: int, repeat: int) -> float:
    """Median seconds per call over `repeat` runs of `number` calls."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=300)
    args = ap.parse_args()
    lora = [(1732390000.0 + i, f"lora-{i}", "") for i in range(3)]
    cases = [
        ("vllm 1 engine", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41)),
        ("vllm + LoRA", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41, lora=lora)),
        ("vllm DP=4", "vllm", vllm_exposition(waiting=3, running=12, kv=0.41, engines=4)),
        ("sglang", "sglang", sglang_exposition(waiting=2, running=9, usage=0.3)),
        ("trtllm-serve", "trtllm-serve", trtllm_exposition(waiting=1, running=5, util=0.2)),
        ("triton", "triton", triton_exposition(waiting=1, scheduled=5, fraction=0.2)),
    ]
    budget_us = INTERVAL / ENDPOINTS * 1e6
    print(f"{ENDPOINTS} endpoints every {INTERVAL * 1000:.0f} ms = {ENDPOINTS / INTERVAL:,.0f} expositions/s; "
          f"budget {budget_us:.1f} µs each on one core\n")
    hdr = f"{'exposition':<14} {'bytes':>7} {'lines':>6} {'fast µs':>9} {'prom µs':>9} {'ratio':>7} {'core @512/50ms':>15}"
    print(hdr)
    print("-" * len(hdr))
    for label, engine, body in cases:
        parse_metrics(body, engine, 0.0)  # warm up, and fail loudly on a broken fixture
        prom_extract(body, engine)
        fast = timeit(lambda b=body, e=engine: parse_metrics(b, e, 0.0), args.number, args.repeat)
        prom = timeit(lambda b=body, e=engine: prom_extract(b, e), max(10, args.number // 10), args.repeat)
        core = fast * ENDPOINTS / INTERVAL
        lines = body.count(b"\n")
        print(f"{label:<14} {len(body):>7} {lines:>6} {fast * 1e6:>9.1f} {prom * 1e6:>9.1f} "
              f"{prom / fast:>6.0f}x {core * 100:>14.1f}%")


if __name__ == "__main__":
    main()

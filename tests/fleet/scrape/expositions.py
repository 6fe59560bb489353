"""Realistic model-server /metrics expositions (vLLM v1, SGLang, trtllm-serve, Triton TRT-LLM).

Written for these tests from the documented metric names and the Prometheus text format: process and GC series,
HELP/TYPE lines, counters with _created samples, and full histograms, so that the parser must skip the bulk of an
exposition the way it would against a live server.
"""

from __future__ import annotations

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_LAT_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)
_TOK_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)


def _process_block() -> list[str]:
    out = []
    for gen, (objs, coll, unc) in enumerate(((1532.0, 110.0, 0.0), (218.0, 10.0, 0.0), (31.0, 1.0, 0.0))):
        out.append(f'python_gc_objects_collected_total{{generation="{gen}"}} {objs}')
        out.append(f'python_gc_collections_total{{generation="{gen}"}} {coll}')
        out.append(f'python_gc_objects_uncollectable_total{{generation="{gen}"}} {unc}')
    return [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        *out,
        "# HELP python_info Python platform information",
        "# TYPE python_info gauge",
        'python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0',
        "# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
        "# TYPE process_virtual_memory_bytes gauge",
        "process_virtual_memory_bytes 7.1283437568e+010",
        "# HELP process_resident_memory_bytes Resident memory size in bytes.",
        "# TYPE process_resident_memory_bytes gauge",
        "process_resident_memory_bytes 4.017590272e+09",
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        "process_start_time_seconds 1.73238190127e+09",
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 1843.41",
        "# HELP process_open_fds Number of open file descriptors.",
        "# TYPE process_open_fds gauge",
        "process_open_fds 131.0",
    ]


def _histogram(name: str, help_: str, buckets: tuple[float, ...], labels: str | list[str], total: int,
               scale: float) -> list[str]:
    out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    for lb in [labels] if isinstance(labels, str) else labels:
        acc = 0
        for i, b in enumerate(buckets):
            acc = min(total, acc + (total // (i + 2)))
            out.append(f'{name}_bucket{{{lb},le="{float(b)}"}} {float(acc)}')
        out.append(f'{name}_bucket{{{lb},le="+Inf"}} {float(total)}')
        out.append(f"{name}_count{{{lb}}} {float(total)}")
        out.append(f"{name}_sum{{{lb}}} {total * scale:.6f}")
    return out


def _counter(name: str, help_: str, labels: str | list[str], value: float, created: float = 1.732381911e9) -> list[str]:
    lbs = [labels] if isinstance(labels, str) else labels
    out = [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
    out += [f"{name}{{{lb}}} {value}" for lb in lbs]
    out += [f"{name.removesuffix('_total')}_created{{{lb}}} {created}" for lb in lbs]
    return out


def _gauge(name: str, help_: str, labels: list[str], value: float) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} gauge"] + [f"{name}{{{lb}}} {value}" for lb in labels]


def vllm_exposition(
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    engines: int = 1,
    block_size: int = 16,
    num_gpu_blocks: int = 27495,
    lora: list[tuple[float, str, str]] | None = None,  # (timestamp, running adapters, waiting adapters)
    max_lora: int = 4,
    legacy_kv_name: bool = False,
    model: str = MODEL,
) -> bytes:
    """vLLM v1 exposition. With engines > 1 (data parallel) each engine gets the same per-engine values."""
    lines = _process_block()
    kv_name = "vllm:gpu_cache_usage_perc" if legacy_kv_name else "vllm:kv_cache_usage_perc"
    lbs = [f'engine="{e}",model_name="{model}"' for e in range(engines)]
    lb = lbs
    lines += _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lbs, float(running))
    lines += _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lbs, float(waiting))
    lines += _gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", lbs, kv)
    lines += _counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", lb, 1804733.0)
    lines += _counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", lb, 1222016.0)
    lines += _counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", lb, 0.0)
    lines += _counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", lb, 1912331.0)
    lines += _counter("vllm:generation_tokens_total", "Number of generation tokens processed.", lb, 488120.0)
    lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
              "# TYPE vllm:request_success_total counter"]
    for one in lbs:
        for reason in ("stop", "length", "abort"):
            lines.append(f'vllm:request_success_total{{{one},finished_reason="{reason}"}} {3021.0 if reason == "stop" else 12.0}')
    lines += _histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOK_BUCKETS, lb, 3045, 628.0)
    lines += _histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", _TOK_BUCKETS, lb, 3045, 160.0)
    lines += _histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                        (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192), lb, 91233, 21.0)
    lines += _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS, lb, 3045, 0.112)
    lines += _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS, lb, 485075, 0.0131)
    lines += _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _LAT_BUCKETS, lb, 3045, 2.31)
    lines += _histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _LAT_BUCKETS, lb, 3045, 0.021)
    lines += _histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _LAT_BUCKETS, lb, 3045, 0.081)
    lines += _histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _LAT_BUCKETS, lb, 3045, 2.2)
    lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",calculate_kv_scales="False",'
        f'cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
        f'is_attention_free="False",num_cpu_blocks="2048",num_gpu_blocks="{num_gpu_blocks}",'
        f'num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",'
        f'swap_space="4",swap_space_bytes="4294967296"}} 1.0',
    ]
    if lora is not None:
        lines += [
            "# HELP vllm:lora_requests_info Running stats on lora requests.",
            "# TYPE vllm:lora_requests_info gauge",
        ]
        for ts, run, wait in lora:
            lines.append(
                f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{run}",'
                f'waiting_lora_adapters="{wait}"}} {ts:.10e}'
            )
    return ("\n".join(lines) + "\n").encode()


def sglang_exposition(waiting: int = 0, running: int = 0, usage: float = 0.0, page_size: int = 1,
                      num_pages: int = 414000, model: str = MODEL) -> bytes:
    lb = f'model_name="{model}",tp_rank="0",pp_rank="0"'
    lines = _process_block()
    for name, help_, val in (
        ("sglang:num_running_reqs", "The number of running requests.", float(running)),
        ("sglang:num_used_tokens", "The number of used tokens.", 9812.0),
        ("sglang:token_usage", "The token usage.", usage),
        ("sglang:gen_throughput", "The generation throughput (token/s).", 1432.7),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float(waiting)),
        ("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.41),
        ("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", 0.0),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{{{lb}}} {val}"]
    lines += _counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", lb, 1031232.0)
    lines += _counter("sglang:generation_tokens_total", "Number of generation tokens processed.", lb, 322101.0)
    lines += _counter("sglang:num_requests_total", "Number of requests processed.", lb, 2004.0)
    lines += _histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS, lb, 2004, 0.09)
    lines += _histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS, lb, 320097, 0.011)
    lines += _histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", _LAT_BUCKETS, lb, 2004, 1.9)
    lines += [
        "# HELP sglang:cache_config_info Information of the cache configuration",
        "# TYPE sglang:cache_config_info gauge",
        f'sglang:cache_config_info{{model_name="{model}",num_pages="{num_pages}",page_size="{page_size}"}} 1.0',
    ]
    return ("\n".join(lines) + "\n").encode()


def trtllm_exposition(waiting: int = 0, running: int = 0, util: float = 0.0, tokens_per_block: int = 32,
                      max_blocks: int = 8192) -> bytes:
    lb = f'model_name="{MODEL}",engine_type="trtllm"'
    lines = _process_block()
    for name, val in (
        ("trtllm_num_requests_running", float(running)),
        ("trtllm_num_requests_waiting", float(waiting)),
        ("trtllm_kv_cache_utilization", util),
        ("trtllm_kv_cache_tokens_per_block", float(tokens_per_block)),
        ("trtllm_kv_cache_max_blocks", float(max_blocks)),
        ("trtllm_kv_cache_used_blocks", float(int(util * max_blocks))),
    ):
        lines += [f"# HELP {name} {name.replace('_', ' ')}", f"# TYPE {name} gauge", f"{name}{{{lb}}} {val}"]
    lines += _histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS, lb, 877, 0.2)
    return ("\n".join(lines) + "\n").encode()


def triton_exposition(waiting: int = 0, scheduled: int = 0, fraction: float = 0.0, tokens_per: int = 64,
                      max_blocks: int = 5000) -> bytes:
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="ensemble",version="1"} 1200',
        'nv_inference_request_success{model="tensorrt_llm",version="1"} 1200',
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
        "# TYPE nv_trt_llm_request_metrics gauge",
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1',
        f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="scheduled",version="1"}} {scheduled}',
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512',
        f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} {scheduled + waiting}',
        f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="waiting",version="1"}} {waiting}',
        "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
        "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"}} {tokens_per}',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} {int(fraction * max_blocks)}',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="free",model="tensorrt_llm",version="1"}} {max_blocks - int(fraction * max_blocks)}',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} {max_blocks}',
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"}} {fraction}',
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
        "# TYPE nv_gpu_utilization gauge",
        'nv_gpu_utilization{gpu_uuid="GPU-7d1a1c33-6a31-3c3e-0a4f-93c4b0e3e0a1"} 0.93',
    ]
    return ("\n".join(lines) + "\n").encode()

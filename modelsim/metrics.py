"""Prometheus metrics of one simulated server (one registry per server), named as vLLM or SGLang name them.

Both flavours are engine observers (modelsim.engine.EngineObserver): every latency is observed when the simulated
event happens, with the exact model-time value the engine computed, so a learner reading them can be checked
against the truth (`GET /admin/requests` holds the same timings per request). Gauges are read from the engine at
scrape time. Latencies are in model seconds, or in wall seconds (× time scale) with `metrics_time: wall`.

vLLM (`engine_type: vllm`, labels `model_name`, `engine`): TTFT and inter-token latency at each token; e2e,
queue, prefill, decode, inference time and the request's mean time per output token when it finishes (as
vllm/v1/metrics/loggers.py does). SGLang (`engine_type: sglang`, label `model_name`): TTFT and inter-token latency
at each token, queue time at admission, e2e and the token counters when the request finishes.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelsim.engine import Engine, Seq
from modelsim.records import timeline

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
VLLM_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                    480.0, 960.0, 1920.0, 7680.0)

SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                       400.0)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                      400.0, 600.0, 1200.0, 1800.0, 2400.0)
SGLANG_QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0,
                        80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0,
                        1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)


class ServerMetrics:
    """vLLM's series (the default flavour)."""

    def __init__(self, engine: Engine, model: str, max_loras: int, scale: float = 1.0) -> None:
        self.engine = engine
        self.model = model
        self.max_loras = max_loras
        self.scale = scale  # reported seconds per model second
        r = self.registry = CollectorRegistry(auto_describe=True)
        lbl = ["model_name", "engine"]
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", lbl, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests in model execution batches.", lbl, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lbl,
                              registry=r)
        self.cache_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
                                ["block_size", "num_gpu_blocks", "enable_prefix_caching"], registry=r)
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on LoRA requests.",
                               ["running_lora_adapters", "waiting_lora_adapters", "max_lora"], registry=r)
        self.pc_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", lbl, registry=r)
        self.pc_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", lbl, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.", lbl, registry=r)
        self.gen_tokens = Counter("vllm:generation_tokens", "Output tokens generated.", lbl,
                                  registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemptions.", lbl, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               lbl + ["finished_reason"], registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, lbl, buckets=buckets, registry=r)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         VLLM_TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Gap between consecutive output tokens, seconds.",
                        VLLM_ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Mean time per output token of each finished request, seconds.", VLLM_ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        VLLM_REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time from arrival to first admission, seconds.",
                          VLLM_REQUEST_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Time from admission to the first token, seconds.", VLLM_REQUEST_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Time from the first token to the last, seconds.",
                           VLLM_REQUEST_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Time from admission to the last token, seconds.", VLLM_REQUEST_BUCKETS)
        lv = (model, "0")
        self._ttft, self._itl = self.ttft.labels(*lv), self.itl.labels(*lv)
        self._finish = [(key, h.labels(*lv)) for key, h in (
            ("e2e", self.e2e), ("queue", self.queue), ("prefill", self.prefill), ("decode", self.decode),
            ("inference", self.inference), ("tpot", self.tpot))]
        cfg = engine.cfg
        self.cache_info.labels(str(cfg.block_size), str(cfg.kv_cache_size),
                               str(cfg.enable_prefix_caching)).set(1)
        self._last = {"pq": 0, "ph": 0, "pt": 0, "gt": 0, "pre": 0}
        self._success_seen: dict[str, int] = {}

    # ---- engine observer -------------------------------------------------------------------------
    def admitted(self, seq: Seq, now: float) -> None:
        pass

    def token(self, seq: Seq, t: float, gap: float | None) -> None:
        if gap is None:
            self._ttft.observe((t - seq.arrival) * self.scale)
        else:
            self._itl.observe(gap * self.scale)

    def finished(self, seq: Seq, t: float) -> None:
        tl = timeline(seq)
        for key, h in self._finish:
            v = tl[key]
            if v is not None:
                h.observe(v * self.scale)

    def aborted(self, seq: Seq, now: float) -> None:
        pass

    # ---- scrape ----------------------------------------------------------------------------------
    def _sync_counter(self, key: str, counter: Counter, value: int) -> None:
        delta = value - self._last[key]
        if delta > 0:
            counter.labels(self.model, "0").inc(delta)
            self._last[key] = value

    def render(self, now: float = 0.0) -> bytes:
        e, lv = self.engine, (self.model, "0")
        self.waiting.labels(*lv).set(len(e.waiting))
        self.running.labels(*lv).set(len(e.running))
        self.kv_usage.labels(*lv).set(e.kv.usage)
        st = e.stats
        self._sync_counter("pq", self.pc_queries, st.prefix_queries)
        self._sync_counter("ph", self.pc_hits, st.prefix_hits)
        self._sync_counter("pt", self.prompt_tokens, st.prompt_tokens)
        self._sync_counter("gt", self.gen_tokens, st.generation_tokens)
        self._sync_counter("pre", self.preemptions, st.preemptions)
        for reason, n in st.success.items():
            seen = self._success_seen.get(reason, 0)
            if n > seen:
                self.success.labels(self.model, "0", reason).inc(n - seen)
                self._success_seen[reason] = n
        self.lora_info.clear()
        self.lora_info.labels(",".join(e.active_loras()), ",".join(e.waiting_loras()),
                              str(self.max_loras)).set(time.time())
        return generate_latest(self.registry)


class SglangMetrics:
    """SGLang's series (python/sglang/srt/metrics/collector.py names, label `model_name`)."""

    def __init__(self, engine: Engine, model: str, scale: float = 1.0) -> None:
        self.engine = engine
        self.model = model
        self.scale = scale
        r = self.registry = CollectorRegistry(auto_describe=True)
        lbl = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lbl, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lbl, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, lbl, buckets=buckets, registry=r)

        self.running = gauge("sglang:num_running_reqs", "Requests in the running batch.")
        self.queued = gauge("sglang:num_queue_reqs", "Requests waiting for admission.")
        self.token_usage = gauge("sglang:token_usage", "Share of the KV pool referenced by requests (0-1).")
        self.used_tokens = gauge("sglang:num_used_tokens", "KV tokens referenced by requests.")
        self.max_tokens = gauge("sglang:max_total_num_tokens", "KV pool size in tokens.")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "Prefix-cache hit share of the prompts admitted since the last scrape.")
        self.gen_throughput = gauge("sglang:gen_throughput", "Tokens generated per second since the last scrape.")
        self.cache_info = Gauge("sglang:cache_config_info", "KV cache geometry.", ["page_size", "num_pages"],
                                registry=r)
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens of finished requests.")
        self.gen_tokens = counter("sglang:generation_tokens", "Output tokens of finished requests.")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache, finished requests.")
        self.requests = counter("sglang:num_requests", "Finished requests.")
        self.aborted_requests = counter("sglang:num_aborted_requests", "Requests cancelled before finishing.")
        self.ttft = hist("sglang:time_to_first_token_seconds", "Time to first token, seconds.",
                         SGLANG_TTFT_BUCKETS)
        self.itl = hist("sglang:inter_token_latency_seconds", "Gap between consecutive output tokens, seconds.",
                        SGLANG_ITL_BUCKETS)
        self.e2e = hist("sglang:e2e_request_latency_seconds", "Arrival to last token, seconds.",
                        SGLANG_E2E_BUCKETS)
        self.queue = hist("sglang:queue_time_seconds", "Time from arrival to admission, seconds.",
                          SGLANG_QUEUE_BUCKETS)
        m = (model,)
        self._ttft, self._itl, self._e2e, self._queue = (h.labels(*m) for h in (self.ttft, self.itl, self.e2e,
                                                                                self.queue))
        cfg = engine.cfg
        self.cache_info.labels(str(cfg.block_size), str(cfg.kv_cache_size)).set(1)
        self.max_tokens.labels(*m).set(cfg.kv_cache_size * cfg.block_size)
        for c in (self.prompt_tokens, self.gen_tokens, self.cached_tokens, self.requests, self.aborted_requests,
                  self.cache_hit_rate, self.gen_throughput):
            c.labels(*m)  # exported as 0 from the start
        self._window_hits = self._window_queries = 0
        self._last_gen = 0
        self._last_render: float | None = None

    def admitted(self, seq: Seq, now: float) -> None:
        self._queue.observe((now - seq.arrival) * self.scale)
        self._window_queries += len(seq.req.prompt_tokens)
        self._window_hits += seq.cached_tokens

    def token(self, seq: Seq, t: float, gap: float | None) -> None:
        if gap is None:
            self._ttft.observe((t - seq.arrival) * self.scale)
        else:
            self._itl.observe(gap * self.scale)

    def finished(self, seq: Seq, t: float) -> None:
        m = (self.model,)
        self._e2e.observe((t - seq.arrival) * self.scale)
        self.prompt_tokens.labels(*m).inc(len(seq.req.prompt_tokens))
        self.gen_tokens.labels(*m).inc(seq.generated)
        self.cached_tokens.labels(*m).inc(seq.cached_tokens)
        self.requests.labels(*m).inc()

    def aborted(self, seq: Seq, now: float) -> None:
        self.aborted_requests.labels(self.model).inc()

    def render(self, now: float = 0.0) -> bytes:
        """`cache_hit_rate` is that of the requests admitted since the previous scrape (unchanged when none were,
        as SGLang logs it per prefill batch); `gen_throughput` the tokens generated since then per second."""
        e, m = self.engine, (self.model,)
        self.running.labels(*m).set(len(e.running))
        self.queued.labels(*m).set(len(e.waiting))
        self.token_usage.labels(*m).set(e.kv.usage)
        self.used_tokens.labels(*m).set(e.kv.used * e.cfg.block_size)
        if self._window_queries:
            self.cache_hit_rate.labels(*m).set(self._window_hits / self._window_queries)
            self._window_hits = self._window_queries = 0
        gen = e.stats.generation_tokens
        if self._last_render is not None and now > self._last_render:
            self.gen_throughput.labels(*m).set((gen - self._last_gen) / ((now - self._last_render) * self.scale))
        self._last_gen, self._last_render = gen, now
        return generate_latest(self.registry)


Metrics = ServerMetrics | SglangMetrics

"""vLLM-named Prometheus metrics for one simulated server (one registry per server).

Gauges are read from the engine at scrape time; histograms are observed when a request finishes.
All latencies are in model seconds.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelsim.engine import Engine, Seq

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, engine: Engine, model: str, max_loras: int) -> None:
        self.engine = engine
        self.model = model
        self.max_loras = max_loras
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
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lbl, registry=r)
        self.gen_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lbl,
                                  registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemptions.", lbl, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               lbl + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lbl, buckets=_TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             lbl, buckets=_E2E_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent waiting in queue.",
                               lbl, buckets=_E2E_BUCKETS, registry=r)
        cfg = engine.cfg
        self.cache_info.labels(str(cfg.block_size), str(cfg.kv_cache_size),
                               str(cfg.enable_prefix_caching)).set(1)
        self._last = {"pq": 0, "ph": 0, "pt": 0, "gt": 0, "pre": 0}
        self._success_seen: dict[str, int] = {}

    def observe_finished(self, seq: Seq) -> None:
        lv = (self.model, "0")
        if seq.ttft is not None:
            self.ttft.labels(*lv).observe(seq.ttft)
        if seq.e2e is not None:
            self.e2e.labels(*lv).observe(seq.e2e)
        if seq.queue_time is not None:
            self.queue.labels(*lv).observe(seq.queue_time)

    def _sync_counter(self, key: str, counter: Counter, value: int) -> None:
        delta = value - self._last[key]
        if delta > 0:
            counter.labels(self.model, "0").inc(delta)
            self._last[key] = value

    def render(self) -> bytes:
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

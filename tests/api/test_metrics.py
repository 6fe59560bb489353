import json
import re
import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.api.metrics import EppMetrics, start_metrics_server
from epp.fleet.datastore import Datastore, PoolSpec
from scheduling.types import Endpoint, Metrics

ROOT = Path(__file__).resolve().parents[2]


def samples(m: EppMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m, metric, **labels):
    return samples(m).get((metric, tuple(sorted(labels.items()))))


def test_request_lifecycle_counters_and_histograms():
    m = EppMetrics()
    m.request_started("llama", "llama-v2", -1)
    m.request_started("llama", "llama-v2", -1)
    assert value(m, "inference_objective_request_total", model_name="llama", target_model_name="llama-v2", priority="-1") == 2
    assert value(m, "inference_objective_running_requests", model_name="llama") == 2
    m.request_finished("llama", "llama-v2", 1.5, input_tokens=300, output_tokens=20)
    m.request_error("llama", "llama-v2", "ResourceExhausted")
    m.request_finished("llama", "llama-v2", None)
    assert value(m, "inference_objective_running_requests", model_name="llama") == 0
    assert value(m, "inference_objective_request_error_total", model_name="llama", target_model_name="llama-v2",
                 error_code="ResourceExhausted") == 1
    lb = {"model_name": "llama", "target_model_name": "llama-v2"}
    assert value(m, "inference_objective_request_duration_seconds_count", **lb) == 1
    assert value(m, "inference_objective_request_duration_seconds_sum", **lb) == 1.5
    assert value(m, "inference_objective_input_tokens_sum", **lb) == 300
    assert value(m, "inference_objective_output_tokens_bucket", le="32.0", **lb) == 1
    assert value(m, "inference_objective_output_tokens_bucket", le="16.0", **lb) == 0


def test_scheduler_plugin_and_disagg():
    m = EppMetrics()
    m.scheduler_duration(0.0004)
    m.plugin_duration("scorer", "prefix-cache-scorer", "prefix", 0.00003)
    m.disagg_decision("llama", "prefill-decode")
    m.disagg_decision("llama", "decode-only")
    m.disagg_decision("llama", "decode-only")
    assert value(m, "inference_extension_scheduler_e2e_duration_seconds_count") == 1
    assert value(m, "inference_extension_plugin_duration_seconds_count", extension_point="scorer",
                 plugin_type="prefix-cache-scorer", plugin_name="prefix") == 1
    assert value(m, "disagg_decision_total", model_name="llama", decision_type="decode-only") == 2


def test_instances_are_independent():
    a, b = EppMetrics(), EppMetrics()
    a.disagg_decision("m", "decode-only")
    assert value(a, "disagg_decision_total", model_name="m", decision_type="decode-only") == 1
    assert value(b, "disagg_decision_total", model_name="m", decision_type="decode-only") is None


def _ep(i, pod, waiting, kv, scraped=True):
    return Endpoint(key=f"10.0.0.{i}:8000", address=f"10.0.0.{i}", port=8000, name=pod,
                    metrics=Metrics(waiting=waiting, kv_usage=kv, updated_at=1.0 if scraped else None, stale=False))


def test_pool_gauges_follow_the_datastore():
    ds = Datastore()
    ds.set_pool(PoolSpec("llama"), [_ep(1, "p1", 4, 0.5), _ep(2, "p2", 2, 0.25), _ep(3, "p3", 0, 0.0, scraped=False)])
    m = EppMetrics(ds)
    assert value(m, "inference_pool_ready_pods", name="llama") == 3
    assert value(m, "inference_pool_average_queue_size", name="llama") == 3.0  # over scraped endpoints only
    assert value(m, "inference_pool_average_kv_cache_utilization", name="llama") == pytest.approx(0.375)
    assert value(m, "inference_pool_per_pod_queue_size", name="llama", model_server_pod="p1") == 4
    ds.set_endpoints("llama", [_ep(1, "p1", 10, 0.9)])
    assert value(m, "inference_pool_ready_pods", name="llama") == 1
    assert value(m, "inference_pool_average_queue_size", name="llama") == 10


async def test_http_server_serves_the_registry():
    m = EppMetrics(Datastore())
    m.request_started("a", "a", 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = await start_metrics_server(m, port, host="127.0.0.1")
    try:
        async with aiohttp.ClientSession() as sess, sess.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            body = await resp.text()
    finally:
        await runner.cleanup()
    assert 'inference_objective_request_total{model_name="a",priority="0",target_model_name="a"} 1.0' in body


def test_grafana_dashboard_uses_only_exported_names():
    dash = json.loads((ROOT / "deploy/grafana/pointsman-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs, "dashboard has no queries"
    m = EppMetrics(Datastore())
    m.request_started("x", "x", 0)
    m.request_error("x", "x", "Internal")
    m.request_finished("x", "x", 1.0, 1, 1)
    m.scheduler_duration(0.001)
    m.plugin_duration("scorer", "t", "n", 0.001)
    m.disagg_decision("x", "decode-only")
    exported = {name for name, _ in samples(m)} | {
        "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
        "inference_pool_ready_pods", "inference_pool_per_pod_queue_size"}
    used = {n for e in exprs for n in re.findall(r"\b(inference_[a-z0-9_]+|disagg_[a-z0-9_]+)", e)}
    assert used and used <= exported, used - exported
    assert {"inference_pool_ready_pods", "inference_objective_request_total", "disagg_decision_total"} <= used


def test_batched_updates_equal_plain_prometheus_updates():
    """The request path batches updates (epp/api/metrics.py); what a scrape sees equals calling prometheus_client
    directly for every update, including values on bucket bounds and past the last one, and pending updates are
    folded after 1024 observations even if nobody scrapes."""
    import random

    from prometheus_client import generate_latest

    m, ref = EppMetrics(), EppMetrics()
    rng = random.Random(3)
    bounds = [0.005, 0.025, 1.0, 3600, 0.0001, 1, 8, 16]
    for i in range(3000):
        model = f"m{i % 3}"
        prio = str(i % 2)
        twin = (model, model, "default-flow", prio)  # the llm-d twin's labels; GIE's series take their share
        m.request_started(model, model, i % 2)
        ref.requests.labels(*twin).inc()
        ref.running.labels(*twin).inc()
        d = rng.choice(bounds) if i % 5 == 0 else rng.expovariate(2.0) * (10 if i % 7 == 0 else 1)
        toks = rng.choice([0, 1, 8, 9, 16, 5000, 10**7])
        m.request_finished(model, model, d, toks, toks // 2, priority=i % 2, request_bytes=toks * 4)
        ref.running.labels(*twin).inc(-1)
        ref.duration.labels(*twin).observe(d)
        if toks:
            ref.input_tokens.labels(*twin).observe(toks)
            ref.request_sizes.labels(*twin).observe(toks * 4)
        if toks // 2:
            ref.output_tokens.labels(*twin).observe(toks // 2)
        m.scheduler_duration(d / 1000)
        ref.scheduler.labels().observe(d / 1000)
        if i == 1500:
            assert m.batch.n_obs < 1024, "pending observations are folded, never unbounded"

    def plain(registry) -> dict:
        return {(fam.name, s.name, tuple(sorted(s.labels.items()))): round(s.value, 6)
                for fam in text_string_to_metric_families(generate_latest(registry).decode())
                for s in fam.samples if not s.name.endswith("_created")}

    assert plain(m.registry) == plain(ref.registry)
    assert m.registry.get_sample_value("inference_objective_request_total",
                                       {"model_name": "m0", "target_model_name": "m0", "priority": "0"}) == 500

"""`epp serve` wired end to end: metrics after traffic, health before/after sync, hot reload good and bad."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.cmd.app import App
from tests.support.envoy import free_port
from tests.support.stack import Stack, serve_args
from tests.support.wait import until

REQUESTS = 'inference_objective_request_total{model_name="llama",priority="0",target_model_name="llama"}'
CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.envoy
async def test_gie_metric_names_after_traffic(tmp_path):
    mport = free_port()
    s = Stack(tmp_path, epp_flags=("--metrics-port", str(mport)))
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            for _ in range(3):
                async with c.post(s.url + "/v1/chat/completions", data=CHAT) as r:
                    assert r.status == 200
                    await r.read()
            async with c.post(s.url + "/v1/chat/completions", data=b"{") as r:
                assert r.status == 400

            async def metrics_page() -> str:
                async with c.get(f"http://127.0.0.1:{mport}/metrics") as r:
                    return await r.text()

            # Until all four requests are counted (a stream is recorded when it ends, which may be just after the
            # client has its answer) and the scraper has filled the pool gauges (a per-pod queue for all three).
            text = ""

            async def settled() -> bool:
                nonlocal text
                text = await metrics_page()
                return (f"{REQUESTS} 3.0" in text and 'error_code="BadRequest"' in text
                        and text.count("inference_pool_per_pod_queue_size{") == 3)

            await until(settled, 10, lambda: f"the requests and the pool gauges on the metrics page:\n{text}")
    finally:
        await s.stop()
    for name in ("inference_objective_request_total", "inference_objective_request_error_total",
                 "inference_objective_request_duration_seconds", "inference_objective_input_tokens",
                 "inference_objective_output_tokens", "inference_objective_running_requests",
                 "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
                 "inference_pool_ready_pods", "inference_extension_scheduler_e2e_duration_seconds",
                 "inference_extension_plugin_duration_seconds"):
        assert name in text, name
    assert f"{REQUESTS} 3.0" in text
    assert 'error_code="BadRequest"' in text
    assert 'inference_pool_ready_pods{name="pool"} 3.0' in text


async def _health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return resp.status


async def test_health_on_both_ports_after_sync(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}]\n")
    hport = free_port()
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps),
                         "--grpc-health-port", str(hport)))
    await app.start()
    try:
        for port in (app.port, hport):
            for svc in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor",
                        "inference-extension"):
                assert await _health(port, svc) == health_pb2.HealthCheckResponse.SERVING, (port, svc)
    finally:
        await app.stop(0)


def replace_file(path: Path, text: str) -> None:
    """Write in one step (a new file renamed over the old): the watcher never reads a half-written version, so the
    version it rejects is this one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def test_scheduling_config_hot_reload_good_and_bad(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}, {address: 127.0.0.2, port: 1}]\n")
    cfg = tmp_path / "sched.yaml"
    cfg.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
                   "metadata: {name: first}\nplugins:\n- type: queue-scorer\n")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--config-file", str(cfg)))
    await app.start()
    try:
        d = app.director
        ex = d.exchange()
        out = ex.decide({":path": "/v1/chat/completions"}, CHAT, {})
        assert out.reject_status == 0 and ex.result.profile == "first"
        old = d.scheduler
        watcher = app.watchers["scheduling config"]
        rejected = watcher.failures
        replace_file(cfg, "kind: EndpointPickerConfig\nplugins: [{type: no-such-scorer}]\n")  # invalid
        await until(lambda: watcher.failures > rejected, 8, "the watcher to reject the invalid config")
        assert app.director.scheduler is old, "an invalid config must not replace the serving one"
        cfg.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
                       "metadata: {name: second}\nplugins:\n- type: kv-cache-utilization-scorer\n")
        assert await until(lambda: app.director.scheduler is not old, 8.0)  # a new bundle, swapped whole
        ex2 = app.director.exchange()
        ex2.decide({":path": "/v1/chat/completions"}, CHAT, {})
        assert ex2.result.profile == "second"
        # The request picked before the reload finishes on its own scheduler, and the counts balance.
        ex.close()
        ex2.close()
        assert app.datastore.inflight.view() == {}
    finally:
        await app.stop(0)


async def test_endpoints_file_hot_reload(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}]\n")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps)))
    await app.start()
    try:
        eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}, {address: 127.0.0.9, port: 2}]\n")
        assert await until(lambda: len(app.datastore.snapshot().endpoints) == 2, 8.0)
        watcher = app.watchers["endpoints"]
        rejected = watcher.failures
        replace_file(eps, "pools: [{name: p, endpoints: [{address: 127.0.0.1, port: 99999}]}]\n")  # bad port
        await until(lambda: watcher.failures > rejected, 8, "the watcher to reject the bad port")
        assert [e.key for e in app.datastore.snapshot().endpoints] == ["127.0.0.1:1", "127.0.0.9:2"]
    finally:
        await app.stop(0)


async def test_invalid_startup_config_is_a_clear_error(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools: [{name: p, endpoints: [{address: 127.0.0.1}]}]\n")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps)))
    with pytest.raises(ValueError, match=r"eps.yaml: pools\[0\].endpoints\[0\].port"):
        await app.start()
    await app.stop(0)


async def test_config_sections_reach_admission_and_scraping_and_follow_reloads(tmp_path):
    """saturationDetector sets admission, dataLayer sets where metrics are scraped; a reload applies new values."""
    from aiohttp import web

    from tests.fleet.scrape.expositions import vllm_exposition

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=vllm_exposition(waiting=3, kv=0.1), content_type="text/plain")

    server = web.Application()
    server.router.add_get("/custom/metrics", metrics)
    runner = web.AppRunner(server)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    eps = tmp_path / "eps.yaml"
    eps.write_text(f"pools:\n- name: p\n  endpoints: [{{address: 127.0.0.1, port: {port}}}]\n")
    cfg = tmp_path / "cfg.yaml"

    def write_cfg(queue_threshold: int, path: str, bump: int) -> None:
        cfg.write_text(f"""apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: utilization-detector
  name: sat
  parameters: {{queueDepthThreshold: {queue_threshold}, metricsStalenessThreshold: 5s}}
- type: metrics-data-source
  name: src
  parameters: {{path: {path}}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}]
saturationDetector: {{pluginRef: sat}}
dataLayer:
  sources: [{{pluginRef: src}}]
""")
        st = cfg.stat()
        import os

        os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 10_000_000))

    write_cfg(2, "/custom/metrics", 0)
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--config-file", str(cfg),
                         "--refresh-metrics-interval", "20ms"))
    await app.start()
    try:
        app.datastore.objectives["batch"] = -1  # a sheddable objective (InferenceObjective priority < 0)
        assert app.scraper.source.path == "/custom/metrics"
        for _ in range(100):  # the scraper reads the custom path
            ep = app.datastore.snapshot("p").endpoints[0]
            if ep.metrics.updated_at is not None:
                break
            await asyncio.sleep(0.02)
        assert ep.metrics.waiting == 3
        hdrs = {":path": "/v1/chat/completions", "x-gateway-inference-objective": "batch"}
        ex = app.director.exchange()
        out = ex.decide(hdrs, CHAT, {})
        ex.close()
        assert out.reject_status == 429  # waiting 3 / threshold 2 >= 1: saturated, sheddable refused
        write_cfg(10, "/metrics", 1)  # a reload: threshold 10 admits; the scrape path moves
        await until(lambda: app.scraper.source.path == "/metrics", 4, "the reloaded scrape path")
        ex = app.director.exchange()
        out = ex.decide(hdrs, CHAT, {})
        ex.close()
        assert out.reject_status == 0
    finally:
        await app.stop(0)
        await runner.cleanup()

"""The data layer end to end: the fake API server announces pods, discovery fills the datastore, the scraper reads
each pod's real /metrics server, health turns ready, and a pod that stops answering leaves rotation."""

import socket

import grpc
from aiohttp import web
from fakeapi import FakeKubeAPI, pod, pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.api.health import start_health_server
from epp.fleet.datastore import Datastore
from epp.fleet.k8s.discovery import make_api_client, start_pool_discovery
from epp.fleet.scrape.scraper import MetricsScraper
from tests.support.wait import until

OPTS = {"watch_timeout_s": 5, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}


def vllm_text(waiting: int, kv: float) -> bytes:
    return (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(waiting)}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
    ).encode()


async def serve(ip: str, port: int, state: dict) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        if state.get("down"):
            return web.Response(status=503)
        return web.Response(body=vllm_text(state["waiting"], state["kv"]), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, ip, port).start()
    return runner


async def test_discovery_scrape_and_health_together():
    with socket.socket() as s:  # one port number free on both loopback addresses we use
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        health_port = s.getsockname()[1]
    states = {"127.0.0.2": {"waiting": 3, "kv": 0.5}, "127.0.0.3": {"waiting": 0, "kv": 0.1}}
    runners = [await serve(ip, port, st) for ip, st in states.items()]
    kube = FakeKubeAPI().start()
    kube.apply("inference.networking.k8s.io", "inferencepools", pool("llama", {"app": "vllm"}, [port]))
    kube.apply("", "pods", pod("a", "127.0.0.2", {"app": "vllm"}))
    ds = Datastore()
    health = await start_health_server(ds, port=health_port, host="127.0.0.1")
    disc = await start_pool_discovery(ds, "llama", "default", api=make_api_client(host=kube.host), **OPTS)
    scraper = MetricsScraper(ds, interval=0.05, failure_threshold=3)
    scraper.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{health_port}")
    stub = health_pb2_grpc.HealthStub(channel)

    async def ready() -> int:
        return (await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)).status

    try:
        assert await ready() == health_pb2.HealthCheckResponse.NOT_SERVING or ds.synced
        assert await disc.wait_synced(5)
        assert await ready() == health_pb2.HealthCheckResponse.SERVING
        key_a, key_b = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
        await until(lambda: ds.snapshot().by_key[key_a].metrics.waiting == 3, 5.0)
        kube.apply("", "pods", pod("b", "127.0.0.3", {"app": "vllm"}))
        await until(lambda: key_b in ds.snapshot().by_key and ds.snapshot().by_key[key_b].metrics.updated_at, 5.0)
        assert ds.snapshot().by_key[key_b].metrics.kv_usage == 0.1
        states["127.0.0.2"]["waiting"] = 7
        await until(lambda: ds.snapshot().by_key[key_a].metrics.waiting == 7, 5.0)
        states["127.0.0.3"]["down"] = True
        await until(lambda: not ds.is_routable(key_b), 5.0)
        assert ds.is_routable(key_a)
        kube.delete("", "pods", "b")
        await until(lambda: key_b not in ds.snapshot().by_key and ds.is_routable(key_b), 5.0)
    finally:
        await channel.close()
        await scraper.stop()
        await disc.stop()
        await health.stop(None)
        kube.stop()
        for r in runners:
            await r.cleanup()

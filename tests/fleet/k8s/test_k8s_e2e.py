"""`epp serve --pool-name` as an InferencePool's EPP: discovery through the real kubernetes client (from a
kubeconfig) against the wire-level fake API server, health gated on sync, and real Envoy routing to the pods."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import orjson
import pytest
import yaml
from fakeapi import FakeKubeAPI, objective, pod, pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port
from tests.support.stack import serve_args
from tests.support.wait import until

POOLS, CORE, X = "inference.networking.k8s.io", "", "inference.networking.x-k8s.io"
CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})


async def readiness(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return (await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)).status


@pytest.mark.envoy
async def test_inference_pool_epp_end_to_end(tmp_path):
    kube = FakeKubeAPI().start()
    ports = [free_port(), free_port()]
    fleet = EchoFleet(ports)
    await fleet.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    # GIE's chart flags, unchanged.
    app = App(serve_args("--pool-name", "llama", "--pool-namespace", "default", "--kubeconfig", str(kubeconfig),
                         "--grpc-port", str(free_port())))
    envoy = None
    try:
        await app.start()
        assert await readiness(app.port) == health_pb2.HealthCheckResponse.NOT_SERVING, "not ready before sync"
        kube.apply(POOLS, "inferencepools", pool("llama", {"app": "vllm"}, ports))
        kube.apply(CORE, "pods", pod("vllm-0", "127.0.0.1", {"app": "vllm"}))
        kube.apply(X, "inferenceobjectives", objective("batch", "llama", -1))
        # Each kind arrives on its own watch, in no fixed order.
        await until(lambda: app.datastore.synced and app.datastore.snapshot("llama") is not None
                    and len(app.datastore.snapshot("llama").endpoints) == 2
                    and app.datastore.objectives == {"batch": -1}, 8.0)
        assert await readiness(app.port) == health_pb2.HealthCheckResponse.SERVING
        lp, ap = free_port(), free_port()
        envoy = Envoy(render_yaml(EnvoyConfigSpec(listen_port=lp, admin_port=ap, epp_port=app.port)), lp, ap)
        await asyncio.to_thread(envoy.start)
        served = set()
        async with aiohttp.ClientSession() as c:
            for _ in range(6):
                async with c.post(f"http://127.0.0.1:{lp}/v1/chat/completions", data=CHAT) as r:
                    assert r.status == 200
                    info = await r.json()
                    served.add(info["served_by"])
            assert served <= set(ports)
            # The pod goes away: the pool has no endpoints and requests get a clear 503.
            kube.delete(CORE, "pods", "vllm-0")
            await until(lambda: len(app.datastore.snapshot("llama").endpoints) == 0, 8.0)
            async with c.post(f"http://127.0.0.1:{lp}/v1/chat/completions", data=CHAT) as r:
                assert r.status == 503
                assert (await r.text()).startswith("inference error: ServiceUnavailable")
    finally:
        if envoy:
            envoy.stop()
        await app.stop(0)
        await fleet.stop()
        kube.stop()

"""EDS follows Kubernetes discovery: a pod joining or leaving the InferencePool reaches a running Envoy's pool
cluster within about a second, through the real kubernetes client against the wire-level fake API server."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import yaml
from fakeapi import FakeKubeAPI, pod, pool

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, cluster_addresses, free_port
from tests.support.stack import serve_args
from tests.support.wait import seconds_until

POOLS, CORE = "inference.networking.k8s.io", ""
CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.envoy
async def test_pods_joining_and_leaving_reach_envoy_by_eds(tmp_path):
    kube = FakeKubeAPI().start()
    port = free_port()
    fleet = EchoFleet([port])
    await fleet.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    app = App(serve_args("--pool-name", "llama", "--kubeconfig", str(kubeconfig), "--grpc-port", str(free_port())))
    envoy = None
    try:
        await app.start()
        kube.apply(POOLS, "inferencepools", pool("llama", {"app": "vllm"}, [port]))
        kube.apply(CORE, "pods", pod("vllm-0", "127.0.0.1", {"app": "vllm"}))
        lp, ap = free_port(), free_port()
        spec = EnvoyConfigSpec(variant="override-host", eds=True, pool_name="llama", listen_port=lp, admin_port=ap,
                               epp_port=app.port)
        envoy = Envoy(render_yaml(spec), lp, ap)
        await asyncio.to_thread(envoy.start)
        first = f"127.0.0.1:{port}"
        await seconds_until(lambda: set(cluster_addresses(ap)) == {first}, 10, "the first pod in Envoy", blocking=True)
        async with aiohttp.ClientSession() as c, c.post(f"http://127.0.0.1:{lp}/v1/chat/completions",
                                                        data=CHAT) as r:
            assert r.status == 200 and (await r.json())["served_by"] == port

        second = f"127.0.0.2:{port}"  # another loopback address: a second pod
        kube.apply(CORE, "pods", pod("vllm-1", "127.0.0.2", {"app": "vllm"}))
        joined = await seconds_until(lambda: second in cluster_addresses(ap), 5, "the new pod in Envoy", blocking=True)
        kube.delete(CORE, "pods", "vllm-1")
        left = await seconds_until(lambda: set(cluster_addresses(ap)) == {first}, 5, "the deleted pod gone from Envoy", blocking=True)
        # Watch event -> datastore -> EDS push -> Envoy, with admin polling on top; loose for a busy machine.
        assert joined < 1.5 and left < 1.5, (joined, left)
        assert envoy.proc is not None and envoy.proc.poll() is None
    finally:
        if envoy:
            envoy.stop()
        await app.stop(0)
        await fleet.stop()
        kube.stop()

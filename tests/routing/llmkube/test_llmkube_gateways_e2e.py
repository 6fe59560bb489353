"""One Pointsman for two InferencePools behind a real Envoy configured as each gateway data plane configures it:

- AgentGateway: Envoy's HTTPRoute equivalent matches `X-Gateway-Base-Model-Name`, each rule goes to one pool's
  cluster, whose host is the single address Pointsman put in `envoy.lb` (override_host); the ext_proc client is
  agentgateway's encoding (header values in `value`, through tests/support/agentgateway_relay.py) with FULL_DUPLEX
  bodies.
- Gateway (Envoy AI Gateway): the routes match `x-ai-eg-model`, each pool cluster reads the destination header
  (ORIGINAL_DST), FULL_DUPLEX bodies.
The ModelRouter's rules decide; Pointsman sets the routing header to the serving backend's displayName (else name).
"""

from __future__ import annotations

import asyncio
import copy

import aiohttp
import orjson
import pytest
import yaml

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render
from tests.support.agentgateway_relay import AgentgatewayRelay
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port, validate
from tests.support.stack import serve_args

pytestmark = pytest.mark.envoy


def router(plane: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter", "metadata": {"name": "coding"},
        "spec": {"dataPlane": plane, "backends": [
            {"name": "qwen", "displayName": "qwen3-coder", "inferenceServiceRef": {"name": "svc-qwen"}},
            {"name": "llama", "inferenceServiceRef": {"name": "svc-llama"}}],
            "rules": [
                {"name": "pii-stays", "match": {"dataClassification": ["pii"]}, "route": {"backends": ["qwen"]},
                 "failClosed": True},
                {"name": "hard", "match": {"taskComplexity": "complex"}, "route": {"backends": ["llama"]}}],
            "defaultRoute": "qwen"}})


def hcm_of(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def gateway_config(plane: str, listen: int, admin: int, epp: int, pools: dict[str, list[int]]) -> dict:
    eps = [("127.0.0.1", p) for ports in pools.values() for p in ports]
    variant = "override-host" if plane == "AgentGateway" else "original-dst"
    cfg = render(EnvoyConfigSpec(variant=variant, listen_port=listen, admin_port=admin, epp_port=epp,
                                 endpoints=eps if variant == "override-host" else []))
    clusters = cfg["static_resources"]["clusters"]
    base = next(c for c in clusters if c["name"] == "pool")
    clusters.remove(base)
    header = "x-gateway-base-model-name" if plane == "AgentGateway" else "x-ai-eg-model"
    vh = hcm_of(cfg)["route_config"]["virtual_hosts"][0]
    template = vh["routes"][0]
    routes = []
    for backend, ports in pools.items():
        c = copy.deepcopy(base)
        c["name"] = f"pool-{backend}"
        if "load_assignment" in c:
            c["load_assignment"] = {"cluster_name": c["name"], "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                for p in ports]}]}
        clusters.append(c)
        r = copy.deepcopy(template)
        r["name"] = f"to-{backend}"
        r["match"] = {"prefix": "/", "headers": [{"name": header, "string_match": {"exact": backend}}]}
        r["route"]["cluster"] = c["name"]
        routes.append(r)
    routes.append({"name": "no-backend", "match": {"prefix": "/"},
                   "direct_response": {"status": 404, "body": {"inline_string": "no route"}}})
    vh["routes"] = routes
    return cfg


async def run_plane(tmp_path, plane: str) -> None:
    qwen, llama = [free_port(), free_port()], [free_port()]
    fleet = EchoFleet(qwen + llama)
    eps = tmp_path / "eps.yaml"
    eps.write_text(yaml.safe_dump({"pools": [
        {"name": "svc-qwen", "endpoints": [{"address": "127.0.0.1", "port": p} for p in qwen]},
        {"name": "svc-llama", "endpoints": [{"address": "127.0.0.1", "port": p} for p in llama]}]}))
    routes = tmp_path / "routes.yaml"
    routes.write_text(router(plane))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--endpoints-file", str(eps), "--routes-file", str(routes)))
    relay = AgentgatewayRelay(f"127.0.0.1:{epp_port}") if plane == "AgentGateway" else None
    await fleet.start()
    await app.start()
    ext_proc_port = await relay.start() if relay is not None else epp_port
    cfg = gateway_config(plane, listen, admin, ext_proc_port, {"qwen3-coder": qwen, "llama": llama})
    text = yaml.safe_dump(cfg, sort_keys=False)
    (tmp_path / "envoy.yaml").write_text(text)
    assert validate(tmp_path / "envoy.yaml").returncode == 0
    envoy = Envoy(text, listen, admin)
    await asyncio.to_thread(envoy.start)
    try:
        async with aiohttp.ClientSession() as s:
            async def ask(headers: dict, model: str = "anything", stream: bool = False) -> tuple[int, dict]:
                body = orjson.dumps({"model": model, "stream": stream,
                                     "messages": [{"role": "user", "content": "hi"}]})
                async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                  headers={"content-type": "application/json", **headers}) as r:
                    raw = await r.read()
                    assert r.status == 200, raw
                    if stream:
                        return int(r.headers["x-served-by"]), {}
                    info = orjson.loads(raw)
                    return info["served_by"], info["headers"]

            seen_default, seen_hard = set(), set()
            for _ in range(6):
                port, h = await ask({})
                seen_default.add(port)
                assert h["x-gateway-base-model-name"] == "qwen3-coder" and h["x-ai-eg-model"] == "qwen3-coder"
                assert h["x-gateway-model-name"] == "anything"  # the engine's model is the client's
                assert "," not in h["x-gateway-destination-endpoint"]  # a single address
                port, h = await ask({"x-llmkube-task-complexity": "complex"})
                seen_hard.add(port)
                assert h["x-gateway-base-model-name"] == "llama"
            assert seen_default == set(qwen) and seen_hard == set(llama)
            port, _ = await ask({"x-llmkube-task-complexity": "complex", "x-llmkube-classification": "PII"})
            assert port in qwen  # the fail-closed rule comes first
            port, _ = await ask({"x-llmkube-task-complexity": "complex"}, stream=True)
            assert port in llama
        if relay is not None:
            assert relay.streams >= 14 and relay.rewritten >= 14  # every stream came agentgateway-encoded
    finally:
        envoy.stop()
        if relay is not None:
            await relay.stop()
        await app.stop(0)
        await fleet.stop()


async def test_agentgateway_routes_on_base_model_name_across_two_pools(tmp_path):
    await run_plane(tmp_path, "AgentGateway")


async def test_envoy_ai_gateway_routes_on_x_ai_eg_model_across_two_pools(tmp_path):
    await run_plane(tmp_path, "Gateway")

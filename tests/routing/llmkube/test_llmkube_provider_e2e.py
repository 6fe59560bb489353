"""A ModelRouter external backend behind a real Envoy: a plain-HTTP LiteLLM-style upstream (LLMKube allows http
for an in-cluster proxy) reached through the provider cluster `epp envoy-config --routes-file` writes, with the
credential from the conventional Secret key, the upstream model, and no client credential passed on."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import yaml

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.envoy_config.providers import fragments_from_files
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port
from tests.support.stack import serve_args

pytestmark = pytest.mark.envoy


async def test_a_plain_http_external_backend_through_envoy(tmp_path):
    local, lite = free_port(), free_port()
    fleet = EchoFleet([local, lite])
    (tmp_path / "secrets" / "lite-key").mkdir(parents=True)
    (tmp_path / "secrets" / "lite-key" / "LITELLM_MASTER_KEY").write_text("sk-lite-master\n")
    (tmp_path / "eps.yaml").write_text(yaml.safe_dump({"pools": [
        {"name": "svc-a", "endpoints": [{"address": "127.0.0.1", "port": local}]}]}))
    (tmp_path / "routes.yaml").write_text(yaml.safe_dump({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter", "metadata": {"name": "r"},
        "spec": {"backends": [
            {"name": "a", "inferenceServiceRef": {"name": "svc-a"}},
            {"name": "lite", "external": {"provider": "litellm", "model": "openrouter/some-model",
                                          "url": f"http://127.0.0.1:{lite}",
                                          "credentialsSecretRef": {"name": "lite-key"}}}],
            "rules": [{"name": "cloud", "match": {"taskComplexity": "complex"}, "route": {"backends": ["lite"]}}],
            "defaultRoute": "a"}}))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--endpoints-file", str(tmp_path / "eps.yaml"),
                         "--routes-file", str(tmp_path / "routes.yaml"),
                         "--provider-secrets-dir", str(tmp_path / "secrets")))
    fragments, _, errors = fragments_from_files([tmp_path / "routes.yaml"])
    assert not errors
    envoy = Envoy(render_yaml(EnvoyConfigSpec(variant="override-host", listen_port=listen, admin_port=admin,
                                              epp_port=epp_port, endpoints=[("127.0.0.1", local)],
                                              route_fragments=fragments)), listen, admin)
    await fleet.start()
    await app.start()
    await asyncio.to_thread(envoy.start)
    try:
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"model": "mine", "messages": [{"role": "user", "content": "hi"}]})
            headers = {"content-type": "application/json", "authorization": "Bearer client-secret",
                       "x-llmkube-task-complexity": "complex"}
            async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                got = orjson.loads(await r.read())
            assert got["served_by"] == lite
            assert got["headers"]["authorization"] == "Bearer sk-lite-master"
            assert got["received_model"] == "openrouter/some-model" and got["path"] == "/v1/chat/completions"
            assert "x-llmkube-task-complexity" not in got["headers"]  # client headers stay home
            async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                              headers={"content-type": "application/json"}) as r:
                assert (orjson.loads(await r.read()))["served_by"] == local
    finally:
        envoy.stop()
        await app.stop(0)
        await fleet.stop()

"""Kubernetes: Kthena's documents watched with the real client (`--watch-routes`), the Secrets providers name, and
many InferencePools in one Pointsman (`--epp-service-name`), against the wire-level fake API server."""

from __future__ import annotations

import logging

import orjson
import pytest
from fakeapi import FakeKubeAPI, pod, pool, secret

from epp.cmd.app import App
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

K, CORE = "networking.serving.volcano.sh", ""
HDRS = {":path": "/v1/chat/completions", ":method": "POST"}



def decide(app, model, headers=None, metadata=None):
    ex = app.director.exchange()
    out = ex.decide({**HDRS, **(headers or {})},
                    orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}), metadata or {})
    ex.close()
    return out


def dest(out) -> str | None:
    return dict(out.set_headers).get("x-gateway-destination-endpoint")


def model_server(name, selector, port=8000, engine="vLLM", model=None):
    spec = {"inferenceEngine": engine, "workloadSelector": {"matchLabels": selector}, "workloadPort": {"port": port}}
    if model:
        spec["model"] = model
    return {"metadata": {"name": name}, "spec": spec}


def model_route(name, model, rules):
    return {"metadata": {"name": name}, "spec": {"modelName": model, "rules": rules}}


@pytest.fixture
async def kube():
    api = FakeKubeAPI().start()
    yield api
    api.stop()


async def test_watched_routes_servers_providers_and_secrets(kube, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    kube.apply(CORE, "pods", pod("ds-0", "10.0.0.1", {"app": "ds"}))
    kube.apply(CORE, "pods", pod("ds-1", "10.0.0.2", {"app": "ds"}))
    kube.apply(CORE, "pods", pod("other", "10.0.0.9", {"app": "other"}))
    kube.apply(K, "modelservers", model_server("ds", {"app": "ds"}, model="deepseek-ai/real"))
    kube.apply(K, "modelroutes", model_route("r", "deepseek", [
        {"name": "cloud", "modelMatch": {"headers": {"x-cloud": {"exact": "1"}}},
         "targetModels": [{"externalModelProviderName": "openai"}]},
        {"name": "local", "targetModels": [{"modelServerName": "ds"}]}]))
    kube.apply(K, "externalmodelproviders", {"metadata": {"name": "openai"}, "spec": {
        "baseURL": "https://api.example.com", "auth": {"secretRef": {"name": "openai-key", "key": "token"}}}})
    kube.apply(CORE, "secrets", secret("openai-key", {"token": "sk-first"}))
    kube.apply(CORE, "secrets", secret("unrelated", {"token": "never-read"}))
    app = App(serve_args("--watch-routes", "--pool-namespace", "default", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kubeconfig")),
                         "--grpc-port", str(free_port())))
    await app.start()
    try:
        await until(lambda: app.datastore.synced, 10.0, "synced")
        await until(lambda: dest(decide(app, "deepseek")) is not None, 10.0, "routed")
        assert dest(decide(app, "deepseek")) in ("10.0.0.1:8000", "10.0.0.2:8000")
        out = decide(app, "deepseek")
        assert orjson.loads(out.body)["model"] == "deepseek-ai/real"
        await until(lambda: dict(decide(app, "deepseek", {"x-cloud": "1"}).set_headers).get("authorization")
                    == "Bearer sk-first", 10.0, "secret")
        # only the Secret a provider names is read, by name
        secret_reads = [p for v, pl, p in kube.requests if pl == "secrets"]
        assert secret_reads and all(p.get("fieldSelector") == "metadata.name=openai-key" for p in secret_reads)
        # pods come and go
        kube.delete(CORE, "pods", "ds-0")
        await until(lambda: {e.key for e in app.datastore.snapshot("modelserver:default/ds").endpoints}
                    == {"10.0.0.2:8000"}, 10.0, "pod gone")
        # a Secret rotation reaches the next request
        kube.apply(CORE, "secrets", secret("openai-key", {"token": "sk-second"}))
        await until(lambda: dict(decide(app, "deepseek", {"x-cloud": "1"}).set_headers).get("authorization")
                    == "Bearer sk-second", 10.0, "rotated")
        # a bad update keeps the last good version; the error is logged and counted
        kube.apply(K, "modelservers", model_server("ds", {"app": "ds"}, engine="TGI"))
        await until(lambda: b'pointsman_route_document_errors_total{kind="ModelServer"} 1.0'
                    in app.metrics.exposition(), 10.0, "error counted")
        assert dest(decide(app, "deepseek")) == "10.0.0.2:8000"
        assert orjson.loads(decide(app, "deepseek").body)["model"] == "deepseek-ai/real"
        # a good update applies
        kube.apply(K, "modelservers", model_server("ds", {"app": "other"}, port=9000, engine="SGLang"))
        await until(lambda: dest(decide(app, "deepseek")) == "10.0.0.9:9000", 10.0, "updated")
        # the Secret deleted: the provider is not ready (503), and says so without any value
        kube.delete(CORE, "secrets", "openai-key")
        await until(lambda: decide(app, "deepseek", {"x-cloud": "1"}).reject_status == 503, 10.0, "no secret")
        assert "sk-" not in decide(app, "deepseek", {"x-cloud": "1"}).reject_body
        # the route deleted: 404
        kube.delete(K, "modelroutes", "r")
        await until(lambda: decide(app, "deepseek").reject_status == 404, 10.0, "route gone")
        text = caplog.text + app.metrics.exposition().decode()
        assert "ModelServer default/ds" in text  # the logs were captured
        for value in ("sk-first", "sk-second", "never-read"):
            assert value not in text
    finally:
        await app.stop(0)


@pytest.mark.parametrize("group", ["inference.networking.k8s.io", "inference.networking.x-k8s.io"])
async def test_many_inference_pools_in_one_epp(kube, tmp_path, group):
    def ip(name, sel, port, epp):
        obj = pool(name, sel, [port], epp=epp)
        if group != "inference.networking.k8s.io":  # v1alpha2: selector map, one port, extensionRef
            obj["spec"] = {"selector": sel, "targetPortNumber": port, "extensionRef": {"name": epp}}
        return obj

    kube.apply(group, "inferencepools", ip("llama", {"app": "llama"}, 8000, "pointsman-epp"))
    kube.apply(group, "inferencepools", ip("qwen", {"app": "qwen"}, 8001, "pointsman-epp"))
    kube.apply(group, "inferencepools", ip("theirs", {"app": "theirs"}, 8002, "another-epp"))
    kube.apply(CORE, "pods", pod("l0", "10.1.0.1", {"app": "llama"}, annotations={"llm-d.ai/models": "llama,shared"}))
    kube.apply(CORE, "pods", pod("q0", "10.2.0.1", {"app": "qwen"}, annotations={"llm-d.ai/models": "qwen,shared"}))
    kube.apply(CORE, "pods", pod("t0", "10.3.0.1", {"app": "theirs", "llm-d.ai/model": "llama"}))
    app = App(serve_args("--epp-service-name", "pointsman-epp", "--pool-group", group, "--pool-namespace", "default",
                         "--kubeconfig", str(kube.kubeconfig(tmp_path / "kubeconfig")), "--grpc-port", str(free_port())))
    await app.start()
    try:
        await until(lambda: app.datastore.synced, 10.0, "synced")
        await until(lambda: app.datastore.pool_names() == ["llama", "qwen"], 10.0, "pools")
        await until(lambda: all(app.datastore.snapshot(p).endpoints for p in ("llama", "qwen")), 10.0, "pods")
        # each request is scheduled in its own pool: by the model the pool serves ...
        assert dest(decide(app, "llama")) == "10.1.0.1:8000"
        assert dest(decide(app, "qwen")) == "10.2.0.1:8001"
        # ... by the subset hint, or by the pool Envoy names in route metadata
        hint = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["10.2.0.1:8001"]}}
        assert dest(decide(app, "shared", metadata=hint)) == "10.2.0.1:8001"
        assert dest(decide(app, "shared", metadata={"pointsman": {"pool": "llama"}})) == "10.1.0.1:8000"
        # no way to tell (both serve it): a 503 naming the pools
        out = decide(app, "shared")
        assert out.reject_status == 503 and "llama, qwen" in out.reject_body
        # a pool that stops naming this Service is no longer served
        kube.apply(group, "inferencepools", ip("qwen", {"app": "qwen"}, 8001, "another-epp"))
        await until(lambda: app.datastore.pool_names() == ["llama"], 10.0, "qwen gone")
        assert dest(decide(app, "shared")) == "10.1.0.1:8000"  # one pool left: no ambiguity
    finally:
        await app.stop(0)

"""Kubernetes: LLMKube's ModelRouter watched with the real client (`--watch-routes`) against the wire-level fake API
server: InferenceService pods by their label, the external backend's Secret by name, live updates, a bad update
that keeps the last good version, and a cluster without the CRD (or without Kthena's) that still syncs."""

from __future__ import annotations

import orjson
import pytest
from fakeapi import FakeKubeAPI, pod, secret
from test_k8s_routes import decide, dest

from epp.cmd.app import App
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

L, K, CORE = "inference.llmkube.dev", "networking.serving.volcano.sh", ""


def model_router(default: str = "qwen", budgets: list | None = None) -> dict:
    return {"metadata": {"name": "coding", "annotations": {"pointsman.io/service-ports": "qwen3-coder=8000"}},
            "spec": {"backends": [
                {"name": "qwen", "inferenceServiceRef": {"name": "qwen3-coder"}},
                {"name": "llama", "inferenceServiceRef": {"name": "llama"}},
                {"name": "gpt", "external": {"provider": "openai", "model": "gpt-5",
                                             "credentialsSecretRef": {"name": "openai-key"}}}],
                "rules": [{"name": "pii", "match": {"dataClassification": ["pii"]}, "route": {"backends": ["qwen"]},
                           "failClosed": True},
                          {"name": "hard", "match": {"taskComplexity": "complex"},
                           "route": {"backends": ["gpt", "llama"]}}],
                "defaultRoute": default, "policy": {"budgets": budgets or []}}}


@pytest.fixture
async def kube():
    api = FakeKubeAPI(missing=frozenset({"modelroutes", "modelservers", "externalmodelproviders"})).start()
    yield api
    api.stop()


async def test_a_watched_model_router_routes_by_its_inference_services_pods(kube, tmp_path):
    svc = "inference.llmkube.dev/service"
    kube.apply(CORE, "pods", pod("qwen-0", "10.0.1.1", {svc: "qwen3-coder"}))
    kube.apply(CORE, "pods", pod("llama-0", "10.0.2.1", {svc: "llama"}))
    kube.apply(CORE, "pods", pod("other", "10.0.9.9", {"app": "other"}))
    kube.apply(L, "modelrouters", model_router())
    kube.apply(CORE, "secrets", secret("openai-key", {"OPENAI_API_KEY": "sk-abc"}))
    app = App(serve_args("--watch-routes", "--pool-namespace", "default", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kubeconfig")),
                         "--grpc-port", str(free_port())))
    await app.start()
    try:
        # Kthena's CRDs are not installed here: the routes still sync
        await until(lambda: app.datastore.synced, 10.0, "synced")
        await until(lambda: dest(decide(app, "anything")) == "10.0.1.1:8000", 10.0, "routed to qwen's pod")
        await until(lambda: dict(decide(app, "m", {"x-llmkube-task-complexity": "complex"}).set_headers)
                    .get("authorization") == "Bearer sk-abc", 10.0, "the secret")
        out = decide(app, "m", {"x-llmkube-task-complexity": "complex"})
        assert orjson.loads(out.body)["model"] == "gpt-5"
        secret_reads = [p for v, pl, p in kube.requests if pl == "secrets"]
        assert secret_reads and all(p.get("fieldSelector") == "metadata.name=openai-key" for p in secret_reads)
        # the Secret goes: the external backend is skipped, primary-fallback serves from llama
        kube.delete(CORE, "secrets", "openai-key")
        await until(lambda: dest(decide(app, "m", {"x-llmkube-task-complexity": "complex"})) == "10.0.2.1:8080", 10.0, "fallback to llama")
        # a live update
        kube.apply(L, "modelrouters", model_router(default="llama"))
        await until(lambda: dest(decide(app, "anything")) == "10.0.2.1:8080", 10.0, "new default")
        # a bad update keeps the last good version
        kube.apply(L, "modelrouters", model_router(default="nope"))
        await until(lambda: b'pointsman_route_document_errors_total{kind="ModelRouter"} 1.0'
                    in app.metrics.exposition(), 10.0, "error counted")
        assert dest(decide(app, "anything")) == "10.0.2.1:8080"
        # pods come and go
        kube.apply(CORE, "pods", pod("llama-1", "10.0.2.2", {svc: "llama"}))
        kube.delete(CORE, "pods", "llama-0")
        await until(lambda: dest(decide(app, "anything")) == "10.0.2.2:8080", 10.0, "pod churn")
        # pii never leaves: the fail-closed rule to qwen
        assert dest(decide(app, "gpt", {"x-llmkube-classification": "PII"})) == "10.0.1.1:8000"
        kube.delete(L, "modelrouters", "coding")
        await until(lambda: decide(app, "anything").reject_status == 404, 10.0, "router gone")
    finally:
        await app.stop(0)


async def test_without_the_model_router_crd_kthena_routes_still_sync(tmp_path):
    api = FakeKubeAPI(missing=frozenset({"modelrouters"})).start()
    try:
        app = App(serve_args("--watch-routes", "--pool-namespace", "default", "--kubeconfig",
                             str(api.kubeconfig(tmp_path / "kubeconfig")), "--grpc-port", str(free_port())))
        await app.start()
        try:
            await until(lambda: app.datastore.synced, 10.0, "synced")
            assert decide(app, "anything").reject_status == 404  # nothing routes yet
            api.apply(CORE, "pods", pod("qwen-0", "10.0.1.1", {"inference.llmkube.dev/service": "qwen3-coder"}))
            api.missing.clear()  # the CRD is installed later: its watch picks it up after a retry
            api.apply(L, "modelrouters", {**model_router(), "spec": {
                "backends": [{"name": "qwen", "inferenceServiceRef": {"name": "qwen3-coder"}}], "defaultRoute": "qwen"}})
            await until(lambda: dest(decide(app, "anything")) == "10.0.1.1:8000", 20, "the ModelRouter created after the CRD was installed")
        finally:
            await app.stop(0)
    finally:
        api.stop()

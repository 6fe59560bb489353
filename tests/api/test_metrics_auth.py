"""`--metrics-endpoint-auth`: GET /metrics asks the (wire-level fake) Kubernetes API who the bearer token is
(TokenReview) and whether that user may get /metrics (SubjectAccessReview), as GIE's EPP does; the default is on
where Pointsman reads Kubernetes and off standalone. Tokens never reach the log."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from epp.cmd.app import App
from tests.fleet.k8s.fakeapi import FakeKubeAPI, pod, pool
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

PROM = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"]}
SECRET_TOKEN = "prometheus-token-0123456789"
OTHER_TOKEN = "someone-else-token-abcdef"



async def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as c, c.get(url, headers=headers) as r:
        return r.status, await r.text()


@pytest.fixture
def kube():
    api = FakeKubeAPI().start()
    api.apply("inference.networking.k8s.io", "inferencepools", pool("llama", {"app": "m"}, [8000]))
    api.apply("", "pods", pod("m-0", "127.0.0.1", {"app": "m"}))
    yield api
    api.stop()


async def test_metrics_need_a_token_kubernetes_allows(kube, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    settings = serve_args("--pool-name", "llama", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kc", "pointsman-sa-token")),
                          "--grpc-port", str(free_port()), "--metrics-port", str(port), "--dashboard=false")
    assert settings.metrics_auth.enabled and not settings.metrics_auth.explicit  # GIE's default, in Kubernetes
    app = App(settings)
    await app.start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        await until(lambda: app.datastore.synced, 15, "the pool to sync")
        kube.tokens[SECRET_TOKEN] = PROM
        kube.tokens[OTHER_TOKEN] = {"username": "mallory", "uid": "u-2", "groups": ["system:authenticated"]}
        assert (await get(url))[0] == 401  # no token
        assert (await get(url, "not-a-token"))[0] == 401  # Kubernetes does not know it
        status, body = await get(url, SECRET_TOKEN)  # known, not allowed yet
        assert status == 403 and PROM["username"] in body
        kube.grants.add((PROM["username"], "get", "/metrics"))
        status, _ = await get(url, SECRET_TOKEN)
        assert status == 403, "a denial is cached for 30 s, as controller-runtime caches it"
        status, _ = await get(url, OTHER_TOKEN)
        assert status == 403
        sar = [spec for kind, spec in kube.reviews if kind == "SubjectAccessReview"]
        assert sar[0]["user"] == PROM["username"] and sar[0]["groups"] == PROM["groups"]
        assert sar[0]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    finally:
        await app.stop(0)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET_TOKEN not in logged and OTHER_TOKEN not in logged and "pointsman-sa-token" not in logged


async def test_an_allowed_token_reads_metrics_and_answers_are_cached(kube, tmp_path):
    port = free_port()
    app = App(serve_args("--pool-name", "llama", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kc", "pointsman-sa-token")),
                         "--grpc-port", str(free_port()), "--metrics-port", str(port), "--dashboard=false"))
    kube.tokens[SECRET_TOKEN] = PROM
    kube.grants.add((PROM["username"], "get", "/metrics"))
    await app.start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(3):
            status, body = await get(url, SECRET_TOKEN)
            assert status == 200 and "# TYPE" in body
        kinds = [kind for kind, _ in kube.reviews]
        assert kinds == ["TokenReview", "SubjectAccessReview"], "one review of each, then the caches answer"
        kube.fail_next = 5  # the API server fails: an unknown token gets 500, not a pass
        status, body = await get(url, "fresh-token")
        assert status == 500 and "fresh-token" not in body
    finally:
        await app.stop(0)


async def test_explicitly_off_and_off_by_default_standalone(kube, tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9}\n")
    assert not serve_args("--endpoints-file", str(eps)).metrics_auth.enabled  # nothing could check a token
    assert serve_args("--endpoints-file", str(eps), "--metrics-endpoint-auth").metrics_auth.enabled
    port = free_port()
    app = App(serve_args("--pool-name", "llama", "--kubeconfig", str(kube.kubeconfig(tmp_path / "kc", "pointsman-sa-token")),
                         "--grpc-port", str(free_port()), "--metrics-port", str(port), "--dashboard=false",
                         "--metrics-endpoint-auth=false"))  # GIE's chart with monitoring auth off
    await app.start()
    try:
        assert (await get(f"http://127.0.0.1:{port}/metrics"))[0] == 200
        assert kube.reviews == []
    finally:
        await app.stop(0)

"""External providers end to end: real Envoy, Pointsman in process, HTTPS upstreams the test starts.

The request goes to the provider's cluster (the config `epp envoy-config` generates from the documents), with the
credential from the mounted Secret file, the provider's path, model and static headers; certificates are verified
against the CA the test creates (and not trusted without it), or not at all with insecureSkipVerify. A client can
never choose a provider, and its own credentials never reach one."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import grpc
import orjson
import pytest

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.envoy_config.providers import fragments_from_files
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port, validate
from tests.support.stack import serve_args
from tests.support.upstream import EchoUpstream, make_certs

pytestmark = pytest.mark.envoy
SECRET = "sk-test-0123456789-very-secret"
SECRET2 = "anthropic-key-abcdef-also-secret"
CLIENT_SECRET = "client-own-token-must-not-travel"

ROUTES = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: local}}
spec:
  inferenceEngine: vLLM
  workloadPort: {{port: {p0}}}
  endpoints: [{{name: e0, address: 127.0.0.1}}, {{name: e1, address: 127.0.0.1, port: {p1}}}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ExternalModelProvider
metadata: {{name: verified}}
spec:
  providerType: OpenAI
  baseURL: https://localhost:{pa}/openai/v1
  model: gpt-upstream
  auth: {{secretRef: {{name: openai-key, key: token}}}}
  headers: {{X-Org: acme}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ExternalModelProvider
metadata: {{name: claude}}
spec:
  providerType: Anthropic
  baseURL: https://127.0.0.1:{pb}
  insecureSkipVerify: true
  auth: {{secretRef: {{name: anthropic-key, key: key}}}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ExternalModelProvider
metadata: {{name: untrusted}}
spec:
  baseURL: https://127.0.0.1:{pb}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ExternalModelProvider
metadata: {{name: nokey}}
spec:
  baseURL: https://localhost:{pa}
  auth: {{secretRef: {{name: missing, key: token}}}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: chat}}
spec:
  modelName: chat
  rules:
  - name: to-verified
    modelMatch: {{headers: {{x-target: {{exact: verified}}}}}}
    targetModels: [{{externalModelProviderName: verified}}]
  - name: to-claude
    modelMatch: {{headers: {{x-target: {{exact: claude}}}}}}
    targetModels: [{{externalModelProviderName: claude}}]
  - name: to-untrusted
    modelMatch: {{headers: {{x-target: {{exact: untrusted}}}}}}
    targetModels: [{{externalModelProviderName: untrusted}}]
  - name: to-nokey
    modelMatch: {{headers: {{x-target: {{exact: nokey}}}}}}
    targetModels: [{{externalModelProviderName: nokey}}]
  - name: local
    targetModels: [{{modelServerName: local}}]
"""


class ProviderStack:
    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.pool_ports = [free_port(), free_port()]
        self.fleet = EchoFleet(self.pool_ports)
        self.pa, self.pb = free_port(), free_port()
        trusted = make_certs(tmp / "trusted", ["localhost", "127.0.0.1"])
        self.ca = trusted["ca.crt"]
        self.verified = EchoUpstream(self.pa, trusted)
        self.selfsigned = EchoUpstream(self.pb, make_certs(tmp / "self", ["127.0.0.1"], self_signed=True))
        secrets = tmp / "secrets"
        (secrets / "openai-key").mkdir(parents=True)
        (secrets / "openai-key" / "token").write_text(SECRET + "\n")
        (secrets / "anthropic-key").mkdir()
        (secrets / "anthropic-key" / "key").write_text(SECRET2)
        self.routes = tmp / "routes.yaml"
        self.routes.write_text(ROUTES.format(p0=self.pool_ports[0], p1=self.pool_ports[1], pa=self.pa, pb=self.pb))
        self.epp_port, self.listen, self.admin, self.metrics_port = free_port(), free_port(), free_port(), free_port()
        self.app = App(serve_args("--grpc-port", str(self.epp_port), "--routes-file", str(self.routes),
                                  "--provider-secrets-dir", str(secrets), "--log-decisions", "--v", "3"))
        fragments, eps, errors = fragments_from_files([self.routes], ca_file=str(self.ca))
        assert not errors, errors
        self.envoy_yaml = render_yaml(EnvoyConfigSpec(variant="override-host", listen_port=self.listen,
                                                      admin_port=self.admin, epp_port=self.epp_port, endpoints=eps,
                                                      route_fragments=fragments))
        self.envoy = Envoy(self.envoy_yaml, self.listen, self.admin)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    async def start(self) -> None:
        for s in (self.verified, self.selfsigned):
            await s.start()
        await self.fleet.start()
        await self.app.start()
        await asyncio.to_thread(self.envoy.start)

    async def stop(self) -> None:
        self.envoy.stop()
        await self.app.stop(0)
        await self.fleet.stop()
        for s in (self.verified, self.selfsigned):
            await s.stop()


@pytest.fixture
async def stack(tmp_path):
    s = ProviderStack(tmp_path)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def post(session, url, body, headers=None):
    async with session.post(url, data=body, headers={"content-type": "application/json", **(headers or {})}) as r:
        return r.status, await r.read(), r.headers


def chat(model="chat", **extra) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **extra})


def test_generated_config_is_valid_for_envoy(tmp_path):
    s = ProviderStack(tmp_path)
    path = tmp_path / "envoy.yaml"
    path.write_text(s.envoy_yaml)
    res = validate(path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert SECRET not in s.envoy_yaml  # credentials are never in the Envoy config: Pointsman sets them per request


async def test_provider_gets_its_credential_path_model_and_static_headers(stack):
    client = {"x-target": "verified", "authorization": f"Bearer {CLIENT_SECRET}", "cookie": "sid=client-cookie",
              "x-api-key": CLIENT_SECRET, "x-custom-client": "private"}
    async with aiohttp.ClientSession() as s:
        status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat(), client)
    assert status == 200, body
    [seen] = stack.verified.requests
    h = seen["headers"]
    assert h["authorization"] == f"Bearer {SECRET}"  # the Secret's value, trimmed
    assert "x-api-key" not in h and "cookie" not in h and "x-custom-client" not in h  # client headers stay home
    assert CLIENT_SECRET not in orjson.dumps(h).decode()
    assert h["x-org"] == "acme"
    assert seen["path"] == "/openai/v1/chat/completions"  # the base URL's path, the request's /v1 dropped
    assert seen["host"] == f"localhost:{stack.pa}"
    assert seen["model"] == "gpt-upstream"  # the provider's model
    assert "x-pointsman-provider" not in h
    reply = orjson.loads(body)
    assert reply["model"] == "chat"  # the client sees the name it asked for


async def test_anthropic_provider_api_key_without_verification(stack):
    body = orjson.dumps({"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as s:
        status, reply, _ = await post(s, stack.url + "/v1/messages", body,
                                      {"x-target": "claude", "anthropic-version": "2023-06-01"})
    assert status == 200, reply
    [seen] = stack.selfsigned.requests
    assert seen["headers"]["x-api-key"] == SECRET2 and "authorization" not in seen["headers"]
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert seen["path"] == "/v1/messages"


async def test_certificate_verification_is_on_unless_insecure_skip_verify(stack):
    async with aiohttp.ClientSession() as s:
        status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat(), {"x-target": "untrusted"})
    assert status == 503, body  # a self-signed certificate nobody vouches for: Envoy refuses the upstream
    assert stack.selfsigned.requests == []


async def test_a_client_can_never_choose_a_provider(stack):
    async with aiohttp.ClientSession() as s:
        for forged in ("provider.default.verified", "provider.default.claude"):
            status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat(),
                                         {"x-pointsman-provider": forged})
            assert status == 200, body
            assert orjson.loads(body)["served_by"] in stack.pool_ports  # the route's pool, not the provider
        # an unrouted model falls to 404 in Pointsman whatever the header says
        status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat("other"),
                                     {"x-pointsman-provider": "provider.default.verified"})
        assert status == 404, body
    assert stack.verified.requests == [] and stack.selfsigned.requests == []


async def test_a_credential_never_appears_in_logs_explain_metrics_or_errors(stack, caplog):
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    async with aiohttp.ClientSession() as s:
        status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat(), {"x-target": "verified"})
        assert status == 200
        status, body, _ = await post(s, stack.url + "/v1/embeddings",
                                     orjson.dumps({"model": "chat", "input": "x"}), {"x-target": "verified"})
        assert status == 400 and b"does not support path '/v1/embeddings'" in body
        texts.append(body.decode())
        status, body, _ = await post(s, stack.url + "/v1/chat/completions", chat(), {"x-target": "nokey"})
        assert status == 503 and b"external provider default/nokey is not ready" in body
        texts.append(body.decode())
        async with s.get(f"http://127.0.0.1:{stack.admin}/config_dump") as r:
            texts.append(await r.text())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.epp_port}") as ch:
        stub = pointsman_pb2_grpc.PointsmanStub(ch)
        for target in ("verified", "claude"):
            resp = await stub.Explain(api.ExplainRequest(path="/v1/chat/completions" if target == "verified"
                                                         else "/v1/messages", body=chat(),
                                                         headers={"x-target": target}))
            assert resp.status == 200, resp.error
            assert resp.route.kind == "provider" and resp.route.target == f"default/{target}"
            name = "authorization" if target == "verified" else "x-api-key"
            assert resp.headers[name] == "<redacted>"
            texts.append(str(resp))
    texts.append(stack.app.metrics.exposition().decode())
    texts.append(caplog.text)
    assert "decision" in caplog.text and "provider default/verified" in caplog.text  # the logs were captured
    for text in texts:
        assert SECRET not in text and SECRET2 not in text

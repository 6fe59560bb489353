"""ModelServer routes through a real Envoy: retries on the fallback endpoints Pointsman lists (x-envoy-max-retries),
and several ModelServers behind one Envoy route."""

from __future__ import annotations

import asyncio
import collections

import aiohttp
import orjson
import pytest

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.envoy_config.providers import fragments_from_files
from tests.support.envoy import Envoy, free_port
from tests.support.stack import serve_args
from tests.support.upstream import EchoUpstream

pytestmark = pytest.mark.envoy

ROUTES = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: flaky}}
spec:
  model: engine-model
  inferenceEngine: vLLM
  workloadPort: {{port: {bad}}}
  endpoints: [{{name: bad, address: 127.0.0.1}}, {{name: good, address: 127.0.0.1, port: {good}}}]
  trafficPolicy: {{retry: {{attempts: {attempts}}}}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: other}}
spec:
  inferenceEngine: SGLang
  workloadPort: {{port: {other}}}
  endpoints: [{{name: o, address: 127.0.0.1}}]
  trafficPolicy: {{retry: {{attempts: 3}}}}  # so the Envoy route has a retry policy whatever flaky says
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: r}}
spec:
  modelName: m
  rules:
  - name: other
    modelMatch: {{headers: {{x-pool: {{exact: other}}}}}}
    targetModels: [{{modelServerName: other}}]
  - name: flaky
    targetModels: [{{modelServerName: flaky}}]
"""


async def run_stack(tmp_path, attempts: int, n: int):
    bad, good, other = EchoUpstream(free_port(), status=503), EchoUpstream(free_port()), EchoUpstream(free_port())
    routes = tmp_path / f"routes-{attempts}.yaml"
    routes.write_text(ROUTES.format(bad=bad.port, good=good.port, other=other.port, attempts=attempts))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--routes-file", str(routes)))
    fragments, eps, errors = fragments_from_files([routes])
    assert not errors
    envoy = Envoy(render_yaml(EnvoyConfigSpec(variant="override-host", listen_port=listen, admin_port=admin,
                                              epp_port=epp_port, endpoints=eps, route_fragments=fragments)),
                  listen, admin)
    for s in (bad, good, other):
        await s.start()
    await app.start()
    await asyncio.to_thread(envoy.start)
    statuses = collections.Counter()
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(n):
                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
                async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                  headers={"content-type": "application/json"}) as r:
                    statuses[r.status] += 1
            async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions",
                              data=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                              headers={"content-type": "application/json", "x-pool": "other"}) as r:
                other_reply = orjson.loads(await r.read())
    finally:
        envoy.stop()
        await app.stop(0)
        for s in (bad, good, other):
            await s.stop()
    return statuses, bad, good, other_reply


async def test_retry_attempts_make_envoy_retry_on_the_fallback_endpoint(tmp_path):
    statuses, bad, good, other = await run_stack(tmp_path, attempts=1, n=16)
    assert len(bad.requests) > 0, "the failing endpoint was never picked first: the test proves nothing"
    assert statuses == {200: 16}, statuses  # each failure was retried on the other endpoint
    assert len(good.requests) == 16
    assert all(r["model"] == "engine-model" for r in good.requests)
    # the other ModelServer, chosen by a rule, behind the same Envoy route
    assert other["port"] != good.port and other["model"] == "m"


async def test_without_retry_attempts_envoy_does_not_retry(tmp_path):
    # The route retries up to 3 times (the other ModelServer), but Pointsman allows 0 for this one.
    statuses, bad, good, _ = await run_stack(tmp_path, attempts=0, n=16)
    assert statuses[503] == len(bad.requests) > 0, statuses
    assert statuses[200] == len(good.requests)


SINGLE = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {{name: single}}
spec:
  inferenceEngine: vLLM
  workloadPort: {{port: {port}}}
  endpoints: [{{name: only, address: 127.0.0.1}}]
  trafficPolicy: {{retry: {{attempts: 3}}}}
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: r}}
spec:
  modelName: m
  rules:
  - name: single
    targetModels: [{{modelServerName: single}}]
"""


@pytest.mark.parametrize("variant", ["override-host", "original-dst"])
async def test_retry_attempts_with_one_endpoint_retry_the_same_host(tmp_path, variant):
    """retry.attempts 3 and a single endpoint: Pointsman allows 3 retries (x-envoy-max-retries 3) and, for
    override_host, lists the one host once per attempt (an exhausted list would fall back to round robin); Envoy
    retries the same host until it answers."""
    only = EchoUpstream(free_port(), first=[503, 503])
    routes = tmp_path / "single.yaml"
    routes.write_text(SINGLE.format(port=only.port))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--routes-file", str(routes)))
    fragments, eps, errors = fragments_from_files([routes])
    assert not errors
    spec = EnvoyConfigSpec(variant=variant, listen_port=listen, admin_port=admin, epp_port=epp_port,
                           endpoints=eps if variant == "override-host" else [], route_fragments=fragments)
    envoy = Envoy(render_yaml(spec), listen, admin)
    await only.start()
    await app.start()
    await asyncio.to_thread(envoy.start)
    try:
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}]})
            async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                              headers={"content-type": "application/json"}) as r:
                status = r.status
            only.first = [503] * 4  # more failures than retries: the client gets the last 503
            async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                              headers={"content-type": "application/json"}) as r:
                exhausted = r.status
    finally:
        envoy.stop()
        await app.stop(0)
        await only.stop()
    assert status == 200, "two failures, then the third attempt on the same host answers"
    assert exhausted == 503
    assert len(only.requests) == 3 + 4, "1 + 3 attempts for the second request, no more"

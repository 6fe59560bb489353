"""One trace through a real Envoy: Envoy's own spans (OpenTelemetry tracer, `epp envoy-config --tracing-collector`)
and Pointsman's under them, all exported to one real OTLP/gRPC receiver; the access log and the response header
carry the decision id the span names."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.support.otlp import GrpcReceiver
from tests.support.stack import Stack
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})
EGRESS = "async envoy.service.ext_proc.v3.ExternalProcessor.Process egress"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
async def traced(tmp_path):
    rx = GrpcReceiver()
    await rx.start()
    log = tmp_path / "access.log"
    s = Stack(tmp_path, epp_flags=("--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1",
                                   "--decision-header", "x-pointsman-decision", "--receipts", "50"),
              envoy_overrides={"tracing_collector": ("127.0.0.1", rx.port), "access_log": str(log)})
    await s.start()
    try:
        yield s, rx, log
    finally:
        await s.stop()
        await rx.stop()


def tree(spans, trace_id):
    return {r.span_id: r for r in spans if r.trace_id == trace_id}


async def test_envoy_and_pointsman_spans_form_one_trace(traced):
    s, rx, log = traced
    ids = []
    async with aiohttp.ClientSession() as c:
        for i in range(3):  # Envoy's tracer flushes every 5 spans or 5 s
            headers = {"content-type": "application/json"}
            if i == 0:
                headers["traceparent"] = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
            async with c.post(s.url + "/v1/chat/completions", data=CHAT, headers=headers) as r:
                assert r.status == 200
                await r.read()
                ids.append(r.headers["x-pointsman-decision"])

    def complete(spans):
        roots = [r for r in spans if r.name == "pointsman.request"]
        return (len(roots) >= 3 and sum(r.name == EGRESS for r in spans) >= 3
                and sum(r.service == "envoy" and r.span.kind == 2 for r in spans) >= 3)

    spans = await rx.wait_for(complete, timeout=30)
    for did in ids:
        ours = next(r for r in spans if r.name == "pointsman.request" and r.attrs()["pointsman.decision_id"] == did)
        assert ours.service == "pointsman" and ours.attrs()["pointsman.parent"] == "envoy"
        t = tree(spans, ours.trace_id)
        egress = t[ours.parent_id]  # Pointsman's parent is Envoy's ext_proc egress span...
        assert egress.service == "envoy" and egress.name == EGRESS and egress.span.kind == 3  # CLIENT
        ingress = t[egress.parent_id]  # ...under Envoy's span of the request
        assert ingress.service == "envoy" and ingress.span.kind == 2  # SERVER
        assert any(r.name == "pointsman.schedule" and r.parent_id == ours.span_id for r in t.values())
        if did == ids[0]:  # the client's traceparent: the whole trace is the client's
            assert ours.trace_id == CLIENT_TRACE and ingress.parent_id == CLIENT_SPAN
    # The access log prints the same decision ids, from the pointsman dynamic-metadata namespace.
    wait_until(lambda: all(f"decision={d}" in log.read_text() for d in ids), 10,
               lambda: f"every decision id in the access log: {log.read_text()}", 0.05)
    text = log.read_text()
    assert f"trace={CLIENT_TRACE}" in text


async def test_a_rejection_carries_its_decision_id_to_the_client_and_the_access_log(traced):
    s, rx, log = traced
    async with aiohttp.ClientSession() as c:
        async with c.post(s.url + "/v1/chat/completions", data=b"{broken",
                          headers={"content-type": "application/json"}) as r:
            assert r.status == 400
            did = r.headers["x-pointsman-decision"]
    assert did.startswith(s.app.director.ids.prefix + "-")
    wait_until(lambda: f"decision={did}" in log.read_text(), 10,
               lambda: f"decision={did} in the access log: {log.read_text()}", 0.05)
    receipt = s.app.recorder.find(s.app.director.ids.parse(did), s.app.director.clock())
    assert receipt is not None and receipt.error == "BadRequest"

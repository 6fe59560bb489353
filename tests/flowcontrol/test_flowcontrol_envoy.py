"""Flow control through a real Envoy, GIE v1.5's semantics (docs/flowcontrol.md): with the `flowControl` gate on,
sheddable requests that arrive while the pool is saturated wait in their band instead of being refused, and are
dispatched as capacity frees; a client that leaves while queued leaves the queue at once and counts as
`EvictedContextCancelled`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.stack.ports import free_port
from tests.support.envoy import Envoy
from tests.support.holding import HoldingFleet
from tests.support.stack import serve_args
from tests.support.wait import until

pytestmark = pytest.mark.envoy

CONFIG = {
    "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "featureGates": ["flowControl"],
    "plugins": [{"type": "concurrency-detector", "name": "slots", "parameters": {"maxConcurrency": 4}},
                {"type": "queue-scorer"}],
    "saturationDetector": {"pluginRef": "slots"},
    "flowControl": {"defaultRequestTTL": "60s"},
}


def chat(n: int) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": f"request {n}"}]})


def outcome_count(exposition: str, outcome: str) -> float:
    """Requests that left flow control's queue with `outcome`, summed over the queue-duration histogram's series."""
    total = 0.0
    for line in exposition.splitlines():
        if (line.startswith("inference_extension_flow_control_request_queue_duration_seconds_count{")
                and f'outcome="{outcome}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def post(s: aiohttp.ClientSession, url: str, n: int, objective: str = "") -> int:
    headers = {"content-type": "application/json"}
    if objective:
        headers["x-gateway-inference-objective"] = objective
    async with s.post(url + "/v1/chat/completions", data=chat(n), headers=headers) as r:
        await r.read()
        return r.status


async def test_saturation_queues_sheddable_requests_and_a_leaving_client_leaves_the_queue(tmp_path: Path):
    ports = [free_port(), free_port()]  # two servers x 4 slots: 8 running requests saturate the pool
    fleet = HoldingFleet(ports)
    await fleet.start()
    eps = tmp_path / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"objectives": {"batch": -1}, "pools": [{"name": "pool", "endpoints": [
        {"address": "127.0.0.1", "port": p, "name": f"server-{p}"} for p in ports]}]}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--endpoints-file", str(eps), "--config-file", str(cfg)))
    await app.start()
    spec = EnvoyConfigSpec(variant="original-dst", listen_port=listen, admin_port=admin, epp_port=epp_port,
                           endpoints=[("127.0.0.1", p) for p in ports])
    envoy = Envoy(render_yaml(spec), listen, admin)
    await asyncio.to_thread(envoy.start)
    url = f"http://127.0.0.1:{listen}"
    flow = app.flow
    assert flow is not None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            running = [asyncio.create_task(post(s, url, i)) for i in range(8)]
            await until(lambda: sum(fleet.inflight.values()) == 8, 20, lambda: f"running {dict(fleet.inflight)}")
            shed = [asyncio.create_task(post(s, url, 100 + i, "batch")) for i in range(4)]
            await until(lambda: flow.queued() == 4, 20, lambda: f"queued {flow.queued()}, {dict(flow.outcomes)}")
            leaving = asyncio.create_task(post(s, url, 200, "batch"))
            await until(lambda: flow.queued() == 5, 20, lambda: f"queued {flow.queued()}, {dict(flow.outcomes)}")
            await asyncio.sleep(0.3)  # a while later they all still wait: saturation holds, it does not refuse
            assert flow.queued() == 5 and not any(t.done() for t in shed)
            assert sum(fleet.inflight.values()) == 8

            t0 = time.monotonic()
            leaving.cancel()  # the client goes away: Envoy resets the ext_proc stream
            await until(lambda: flow.queued() == 4, 10, lambda: f"queued {flow.queued()}, {dict(flow.outcomes)}")
            assert time.monotonic() - t0 < 2.0, "it leaves the queue at once, not at its TTL (60 s) or a dispatch"
            assert flow.outcomes["EvictedContextCancelled"] == 1
            assert flow.outcomes["RejectedCapacity"] == 0
            assert app.metrics is not None  # GIE's queue-duration histogram counts it under GIE's outcome name
            assert outcome_count(app.metrics.exposition().decode(), "EvictedContextCancelled") == 1

            fleet.release()  # capacity frees: the queued requests are dispatched and served
            assert await asyncio.gather(*running) == [200] * 8
            assert await asyncio.wait_for(asyncio.gather(*shed), 20) == [200] * 4
            assert flow.queued() == 0 and sum(fleet.served.values()) == 12
            assert flow.outcomes["EvictedContextCancelled"] == 1
            assert outcome_count(app.metrics.exposition().decode(), "Dispatched") == 12
    finally:
        envoy.stop()
        await app.stop(0)
        await fleet.stop()

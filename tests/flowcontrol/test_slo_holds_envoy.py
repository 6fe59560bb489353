"""Class-aware dispatch through a real Envoy with the built-in default config (docs/latency-model.md): while an
endpoint is busy (half its batch, 8 of maxNumSeqs 16, in flight), a loose request picked onto it waits in
Pointsman, requests without SLO headers and tight ones go at once, a client that leaves while held leaves at once,
and the held request goes when a request there ends."""

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

TIGHT = {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}
LOOSE = {"x-slo-ttft-ms": "60000"}  # a 24 s budget: only a request ending (or the client leaving) ends its hold


async def post(s: aiohttp.ClientSession, url: str, n: int, headers: dict[str, str]) -> int:
    body = orjson.dumps({"model": "llama", "max_tokens": 4, "messages": [{"role": "user", "content": f"r{n}"}]})
    async with s.post(url + "/v1/chat/completions", data=body,
                      headers={"content-type": "application/json", **headers}) as r:
        await r.read()
        return r.status


def held_count(exposition: str, outcome: str) -> float:
    for line in exposition.splitlines():
        if line.startswith("pointsman_slo_held_seconds_count{") and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_loose_request_waits_while_its_endpoint_is_busy_and_a_leaving_client_leaves_at_once(tmp_path: Path):
    port = free_port()
    fleet = HoldingFleet([port])
    await fleet.start()
    eps = tmp_path / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "pool", "endpoints": [
        {"address": "127.0.0.1", "port": port, "name": "server"}]}]}))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--endpoints-file", str(eps)))
    await app.start()
    spec = EnvoyConfigSpec(variant="original-dst", listen_port=listen, admin_port=admin, epp_port=epp_port,
                           endpoints=[("127.0.0.1", port)])
    envoy = Envoy(render_yaml(spec), listen, admin)
    await asyncio.to_thread(envoy.start)
    url = f"http://127.0.0.1:{listen}"
    holds = app.holds
    assert holds is not None and app.metrics is not None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            tight = asyncio.create_task(post(s, url, 1, TIGHT))  # the tight class, held at the server
            await until(lambda: fleet.inflight[port] == 1, 20, lambda: f"in flight {dict(fleet.inflight)}")
            plain = [asyncio.create_task(post(s, url, 10 + i, {})) for i in range(7)]  # no SLO headers: never held
            await until(lambda: fleet.inflight[port] == 8, 20, lambda: f"in flight {dict(fleet.inflight)}")
            loose = asyncio.create_task(post(s, url, 2, LOOSE))
            await until(lambda: holds.count == 1, 20, lambda: f"held {holds.count}, {dict(holds.outcomes)}")
            tight2 = asyncio.create_task(post(s, url, 3, TIGHT))  # a tight one goes at once
            await until(lambda: fleet.inflight[port] == 9, 20, lambda: f"in flight {dict(fleet.inflight)}")
            leaving = asyncio.create_task(post(s, url, 4, LOOSE))
            await until(lambda: holds.count == 2, 20, lambda: f"held {holds.count}, {dict(holds.outcomes)}")
            await asyncio.sleep(0.3)  # a while later the loose ones still wait, and reached no engine
            assert holds.count == 2 and fleet.inflight[port] == 9 and not loose.done()

            t0 = time.monotonic()
            leaving.cancel()  # the client goes away: Envoy resets the ext_proc stream
            await until(lambda: holds.count == 1, 10, lambda: f"held {holds.count}, {dict(holds.outcomes)}")
            assert time.monotonic() - t0 < 2.0, "it leaves at once, not at its deadline"
            assert dict(holds.outcomes) == {"cancelled": 1}

            fleet.release()  # requests end: the held one goes, and everything is served
            done = await asyncio.wait_for(asyncio.gather(tight, tight2, loose, *plain), 30)
            assert done == [200] * 10
            assert dict(holds.outcomes) == {"cancelled": 1, "released": 1} and holds.count == 0
            assert fleet.served[port] == 10
            text = app.metrics.exposition().decode()
            assert held_count(text, "released") == 1 and held_count(text, "cancelled") == 1
            assert "pointsman_slo_held_requests 0.0" in text
            await until(lambda: not holds.tight.pending, 10, lambda: f"tight work {holds.tight.pending}")
    finally:
        envoy.stop()
        await app.stop(0)
        await fleet.stop()

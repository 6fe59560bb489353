"""End to end through Envoy, Pointsman and modelsim with KV events on: a repeated long prefix lands on the endpoint
whose engine really caches it (the cache was filled by traffic that never went through Pointsman), and after
`/reset_prefix_cache` on that server the next pick reflects it within 100 ms."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from test_precise_wiring import PRECISE, chat, explain, post, prefix, write_endpoints

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from scheduling.prefix.precise import LIVE
from tests.support.envoy import Envoy, free_port
from tests.support.stack import serve_args
from tests.support.wait import until

pytestmark = pytest.mark.envoy


async def through_envoy(url: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/chat/completions", data=orjson.dumps(body),
                          headers={"content-type": "application/json"}) as r:
            assert r.status == 200, await r.text()
            await r.read()
            return int(r.headers["x-inference-port"])


async def test_repeated_prefix_follows_the_engine_cache_and_a_reset_within_100ms(make_fleet, tmp_path: Path):
    fleet = await make_fleet(3)
    ports = [fleet.config.port(i) for i in range(3)]
    keys = [f"127.0.0.1:{p}" for p in ports]
    eps = tmp_path / "eps.yaml"
    write_endpoints(eps, fleet, [0, 1, 2])
    grpc_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(grpc_port), "--endpoints-file", str(eps), "--config-text", PRECISE % "2s"))
    await app.start()
    envoy = Envoy(render_yaml(EnvoyConfigSpec(variant="override-host", eds=True, pool_name="pool", listen_port=listen,
                                              admin_port=admin, epp_port=grpc_port)), listen, admin)
    await asyncio.to_thread(envoy.start)
    url = f"http://127.0.0.1:{listen}"
    try:
        assert app.precise is not None
        index = app.precise.index
        await until(lambda: all(index.state(k) == LIVE for k in keys), 5)
        # Servers 1 and 2 learn the long prefix from traffic that bypasses Pointsman.
        await post(fleet.urls[1], chat("first visit"))
        await post(fleet.urls[2], chat("first visit"))
        await until(lambda: index.size(keys[1]) >= 10 and index.size(keys[2]) >= 10, 3.0)
        picks = [await through_envoy(url, chat(f"question {i}")) for i in range(6)]
        assert set(picks) <= {ports[1], ports[2]}, picks
        assert app.metrics is not None  # each routed request was tokenized by an engine's /tokenize, and counted
        assert app.metrics.registry.get_sample_value("pointsman_tokenize_requests_total", {"source": "engine"}) == 6
        # Reset server 1's cache (preempting whatever runs): within 100 ms only server 2 holds the prefix.
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{fleet.urls[1]}/reset_prefix_cache?reset_running_requests=true") as r:
                assert r.status == 200
        t0 = time.monotonic()
        while True:
            resp = await explain(app, chat("after the reset"))
            got = prefix(resp)
            if resp.endpoint == keys[2] and got[keys[1]].blocks == 0:
                break
            assert time.monotonic() - t0 < 0.1, (resp.endpoint, got[keys[1]])
            await asyncio.sleep(0.002)
        assert time.monotonic() - t0 < 0.1
        assert got[keys[2]].source == "events" and got[keys[2]].gpu_blocks >= 10
        assert await through_envoy(url, chat("after the reset")) == ports[2]
    finally:
        envoy.stop()
        await app.stop(0)

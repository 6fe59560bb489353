"""Several pools behind one Envoy and one Pointsman: each Envoy route names its pool in `pointsman.pool` dynamic
metadata (per-route set_metadata), and Pointsman schedules each request in that pool."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import yaml

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render
from epp.envoy_config.providers import name_pools
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port, validate
from tests.support.stack import serve_args

pytestmark = pytest.mark.envoy


async def test_each_envoy_route_names_its_pool(tmp_path):
    a, b = [free_port(), free_port()], [free_port()]
    fleet = EchoFleet(a + b)
    eps = tmp_path / "eps.yaml"
    eps.write_text(yaml.safe_dump({"pools": [
        {"name": "pool-a", "endpoints": [{"address": "127.0.0.1", "port": p} for p in a]},
        {"name": "pool-b", "endpoints": [{"address": "127.0.0.1", "port": p} for p in b]}]}))
    epp_port, listen, admin = free_port(), free_port(), free_port()
    app = App(serve_args("--grpc-port", str(epp_port), "--endpoints-file", str(eps)))
    cfg = render(EnvoyConfigSpec(variant="original-dst", listen_port=listen, admin_port=admin, epp_port=epp_port))
    vh = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]
    default = vh["routes"][0]
    vh["routes"] = [
        {"name": "to-b", "match": {"prefix": "/", "headers": [{"name": "host", "string_match": {"exact": "b.local"}}]},
         "route": default["route"]},
        {**default, "name": "to-a"},
    ]
    name_pools(cfg, {"to-a": "pool-a", "to-b": "pool-b"})
    text = yaml.safe_dump(cfg, sort_keys=False)
    (tmp_path / "envoy.yaml").write_text(text)
    assert validate(tmp_path / "envoy.yaml").returncode == 0
    envoy = Envoy(text, listen, admin)
    await fleet.start()
    await app.start()
    await asyncio.to_thread(envoy.start)
    try:
        seen: dict[str, set[int]] = {"a.local": set(), "b.local": set()}
        async with aiohttp.ClientSession() as s:
            for i in range(12):
                host = "b.local" if i % 2 else "a.local"
                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
                async with s.post(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                  headers={"host": host, "content-type": "application/json"}) as r:
                    assert r.status == 200, await r.text()
                    seen[host].add(orjson.loads(await r.read())["served_by"])
        assert seen["a.local"] and seen["a.local"] <= set(a)
        assert seen["b.local"] == set(b)
    finally:
        envoy.stop()
        await app.stop(0)
        await fleet.stop()

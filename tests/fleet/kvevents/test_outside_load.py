"""`epp serve` with its default profile on KV events, in process, against a real modelsim fleet: requests sent straight
to an engine (bypassing Pointsman) show up in its scraped queue as outside load, and the next pick avoids it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from epp.cmd.app import App
from scheduling.plugins.scorers.estimated_latency import EstimatedLatencyScorer
from tests.fleet.kvevents.test_precise_wiring import MODEL, chat, explain, write_endpoints
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

PROFILE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: estimated-latency-scorer
  parameters: {prefixSource: precise}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: estimated-latency-scorer}, {pluginRef: max-score-picker}]
"""


async def _bypass(url: str, n: int) -> None:
    """A long request straight to the engine (bypassing Pointsman)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4000, "ignore_eos": True,
                            "messages": [{"role": "user", "content": f"outside {n}"}]}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", json=body) as r:
        await r.read()


async def test_requests_that_bypass_pointsman_count_as_outside_load(make_fleet, tmp_path: Path):
    fleet = await make_fleet(2, time_scale=0.05)
    keys = [f"127.0.0.1:{fleet.config.port(i)}" for i in range(2)]
    eps = tmp_path / "eps.yaml"
    write_endpoints(eps, fleet, [0, 1])
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--config-text", PROFILE))
    await app.start()
    outside = [asyncio.ensure_future(_bypass(fleet.urls[0], n)) for n in range(5)]
    try:
        assert app.director is not None
        scorer = next(p for p in app.director.scheduler.plugins() if isinstance(p, EstimatedLatencyScorer))
        load = scorer.outside
        assert load is not None
        await explain(app, chat("who runs what"))  # a decision: the scorer reads the in-flight view
        await until(lambda: load.get(keys[0]) == 5, 10, lambda: f"the scrapes to show 5 outside: {load.get(keys[0])}")
        assert load.get(keys[1]) == 0
        resp = await explain(app, chat("who runs what"))
        assert resp.endpoint == keys[1]  # the engine busy with traffic Pointsman did not send is avoided
        for t in outside:
            t.cancel()
        await asyncio.gather(*outside, return_exceptions=True)
        await until(lambda: load.get(keys[0]) == 0, 10, lambda: f"the outside load to end: {load.get(keys[0])}")
    finally:
        for t in outside:
            t.cancel()
        await app.stop(0)

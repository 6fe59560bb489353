"""`epp serve` with KV events, in process, against real modelsim publishers over real ZMQ: subscriptions follow the
pools (an endpoint leaving takes its subscription and its index entries), the index survives config reloads,
explain reports matches from events, an unreachable publisher never blocks routing, and an llm-d kvEventsConfig
port template is honoured."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from epp.api.explain import PointsmanService
from epp.api.pb import pointsman_pb2 as api
from epp.cmd.app import App
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.kvevents.service import PreciseService
from scheduling.config import load_scheduler
from scheduling.prefix.precise import LIVE, PENDING
from scheduling.types import Endpoint
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"
SYSTEM = "You are a careful assistant who always answers in full sentences. " * 12
PRECISE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters: {speculativeTTL: %s}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: precise-prefix-cache-scorer}, {pluginRef: max-score-picker}]
"""


def chat(question: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "system", "content": SYSTEM},
                                                         {"role": "user", "content": question}]}


def write_endpoints(path: Path, fleet: Any, indexes: list[int], kv: dict[int, str] | None = None) -> None:
    cfg = fleet.config
    eps = []
    for i in indexes:
        ep: dict[str, Any] = {"address": "127.0.0.1", "port": cfg.port(i), "name": f"sim-{i}", "models": [MODEL]}
        ep["kvEvents"] = (kv or {}).get(i) or {"endpoint": f"tcp://127.0.0.1:{cfg.kv_events_port_of(i)}",
                                               "replay": f"tcp://127.0.0.1:{cfg.kv_events_replay_port_of(i)}"}
        eps.append(ep)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"pools": [{"name": "pool", "endpoints": eps}]}))
    tmp.replace(path)


async def post(url: str, body: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()


async def explain(app: App, body: dict[str, Any]) -> api.ExplainResponse:
    assert app.director is not None
    return await PointsmanService(app.director).explain_async(
        api.ExplainRequest(path="/v1/chat/completions", body=orjson.dumps(body)))


def prefix(resp: api.ExplainResponse) -> dict[str, api.PrefixMatch]:
    return {m.endpoint: m for m in resp.prefix}


async def test_subscriptions_follow_the_pools_and_the_index_survives_reloads(make_fleet, tmp_path: Path):
    fleet = await make_fleet(2)
    keys = [f"127.0.0.1:{fleet.config.port(i)}" for i in range(2)]
    eps, cfg = tmp_path / "eps.yaml", tmp_path / "sched.yaml"
    write_endpoints(eps, fleet, [0, 1])
    cfg.write_text(PRECISE % "2s")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--config-file", str(cfg)))
    await app.start()
    try:
        precise = app.precise
        assert precise is not None
        index = precise.index
        await until(lambda: all(index.state(k) == LIVE for k in keys), 5)  # idle engines: caught up
        await post(fleet.urls[1], chat("warm-up"))  # outside traffic: straight to server 1
        resp = await explain(app, chat("a question that nobody asked before"))
        await until(lambda: index.size(keys[1]) > 0, 3.0)
        resp = await explain(app, chat("a question that nobody asked before"))
        assert resp.endpoint == keys[1] and resp.token_source == "engine"
        got = prefix(resp)
        assert got[keys[1]].source == "events" and got[keys[1]].gpu_blocks >= 10
        assert got[keys[0]].source == "events" and got[keys[0]].blocks == 0
        # a reload builds a new scheduler on the same index: what the engines published is still known
        old = app.director.scheduler if app.director else None
        cfg.write_text(PRECISE % "3s")
        await until(lambda: app.director is not None and app.director.scheduler is not old, 10)
        assert app.precise is precise and precise.index is index
        again = prefix(await explain(app, chat("a question that nobody asked before")))
        assert again[keys[1]].gpu_blocks == got[keys[1]].gpu_blocks
        # server 1 leaves the pool: its subscription and its index entries go
        write_endpoints(eps, fleet, [0])
        await until(lambda: keys[1] not in precise.subscriber.sources(), 5)
        assert index.state(keys[1]) is None and index.size(keys[1]) == 0 and keys[1] not in index.endpoints()
        # and it comes back: subscribed again, its retained history replayed
        write_endpoints(eps, fleet, [0, 1])
        await until(lambda: index.state(keys[1]) == LIVE and index.size(keys[1]) > 0, 5)
    finally:
        await app.stop(0)


async def test_an_unreachable_publisher_never_blocks_routing(make_fleet, tmp_path: Path):
    fleet = await make_fleet(1)
    dead = {0: {"endpoint": f"tcp://127.0.0.1:{free_port()}", "replay": f"tcp://127.0.0.1:{free_port()}"}}
    eps = tmp_path / "eps.yaml"
    write_endpoints(eps, fleet, [0], dead)
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps),
                         "--config-text", PRECISE % "2s"))
    await app.start()
    try:
        t0 = time.monotonic()
        resp = await explain(app, chat("hello"))
        assert resp.status == 200 and time.monotonic() - t0 < 0.5
        key = f"127.0.0.1:{fleet.config.port(0)}"
        m = prefix(resp)[key]
        assert (m.source, m.index_state) == ("approximate", PENDING)
        # Nothing arrives, so the catch-up asks the (dead) replay socket and gives up after its timeout; after
        # that: still pending, still routing.
        assert app.precise is not None and app.precise.subscriber is not None
        subscriber = app.precise.subscriber
        await until(lambda: subscriber.status()[key][0].replays_failed >= 1, 10,
                    lambda: f"the catch-up's replay to fail: {subscriber.status()[key]}")
        resp = await explain(app, chat("hello"))
        assert resp.status == 200 and prefix(resp)[key].index_state == PENDING
    finally:
        await app.stop(0)


async def test_an_llm_d_kv_events_config_port_is_the_template_when_the_command_line_sets_none():
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), [Endpoint("127.0.0.1:8000", "127.0.0.1", 8000),
                                   Endpoint("127.0.0.2:8000", "127.0.0.2", 8000)])
    svc = PreciseService(ds, catch_up_after=None)
    svc.attach()
    try:
        assert svc.subscriber is None  # nobody publishes: no subscriber, no sockets
        doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
               "plugins": [{"type": "precise-prefix-cache-scorer", "parameters": {"kvEventsConfig": {
                   "topicFilter": "kv@", "discoverPods": True, "podDiscoveryConfig": {"socketPort": 5556}}}}]}
        svc.apply_config(load_scheduler([doc], rng=random.Random(0), services=svc.services()))
        assert {k: (s.endpoint, s.topic) for k, s in svc.subscriber.sources().items()} == {
            "127.0.0.1:8000": ("tcp://127.0.0.1:5556", "kv@"), "127.0.0.2:8000": ("tcp://127.0.0.2:5556", "kv@")}
        assert svc.index.state("127.0.0.1:8000") == PENDING
        svc.apply_config(load_scheduler(None, rng=random.Random(0)))  # no template any more
        assert svc.subscriber.sources() == {} and svc.index.endpoints() == []
    finally:
        await svc.close()


def test_bad_precise_flags_stop_the_start_with_a_clear_error(tmp_path: Path):
    """They fail in the settings, before anything starts."""
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}]\n")
    for flags, message in ((["--tokenize-timeout", "0"], "--tokenize-timeout"),
                           (["--kv-events-port", "70000"], "--kv-events-port"),
                           (["--kv-events-block-size", "0"], "--kv-events-block-size")):
        with pytest.raises(ValueError, match=message):
            serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), *flags)

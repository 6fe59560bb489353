"""The protocol machine against a real Envoy: awaitable decisions in every body mode, and STREAMED without waiting."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import yaml

from epp.envoy_config import EnvoyConfigSpec, render
from epp.protocol import Outcome
from epp.request.director import Director
from epp.request.exchange import RequestExchange
from tests.support.envoy import Envoy
from tests.support.stack import Stack
from tests.support.wait import until

pytestmark = pytest.mark.envoy


def chat(content: str = "hello", **extra) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": content}], **extra})


class DelayedExchange(RequestExchange):
    """The real exchange, deciding after a pause (as a flow-control queue or a /tokenize call would)."""

    __slots__ = ()

    def decide(self, headers, body, metadata):
        return self._later(headers, body, metadata)

    async def _later(self, headers, body, metadata) -> Outcome:
        await asyncio.sleep(0.02)
        outcome = RequestExchange.decide(self, headers, body, metadata)
        assert isinstance(outcome, Outcome)
        return outcome


class DelayedDirector(Director):
    def exchange(self) -> RequestExchange:
        return DelayedExchange(self)


async def post(c: aiohttp.ClientSession, url: str, data, headers=None) -> tuple[int, dict | str]:
    async with c.post(url, data=data, headers={"content-type": "application/json", **(headers or {})}) as r:
        text = await r.read()
        try:
            return r.status, orjson.loads(text)
        except orjson.JSONDecodeError:
            return r.status, text.decode()


async def until_idle(s: Stack, timeout: float = 10.0) -> None:
    """Envoy closes each ext_proc stream a moment after the response: wait until every count is released."""
    view = s.app.datastore.inflight.view
    await until(lambda: not view(), timeout, lambda: f"every in-flight count released: {view()}", interval=0.01)


def chunked(body: bytes, size: int = 16):
    async def gen():
        for i in range(0, len(body), size):
            yield body[i : i + size]
            await asyncio.sleep(0.002)

    return gen()


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED", "STREAMED"])
async def test_awaitable_decisions_route_through_envoy(tmp_path, mode):
    s = Stack(tmp_path, envoy_overrides={"request_body_mode": mode, "response_body_mode": mode})
    await s.start()
    try:
        d = s.app.director
        s.app.extproc.director = DelayedDirector(d.datastore, d.scheduler, d.config, observers=d.observers)
        async with aiohttp.ClientSession() as c:
            results = await asyncio.gather(*(
                post(c, s.url + "/v1/chat/completions", chunked(chat(f"q{i}")), {"x-gateway-model-name-rewrite": "l2"})
                for i in range(8)))
            for status, info in results:
                assert status == 200, info
                assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
                assert info["received_model"] == ("llama" if mode == "STREAMED" else "l2")
            async with c.get(s.url + "/v1/models") as r:
                assert r.status == 200
        await until_idle(s)
    finally:
        await s.stop()


async def test_streamed_without_waiting_for_the_header_reply_rewrites_the_model(tmp_path):
    """send_body_without_waiting_for_header_response: the header reply is held until the body ends, then every
    chunk gets its reply; the first carries the rewritten body and the others are cleared."""
    s = Stack(tmp_path)
    await s.fleet.start()
    await s.start_epp()
    spec = EnvoyConfigSpec(listen_port=s.listen_port, admin_port=s.admin_port, epp_port=s.epp_port,
                           request_body_mode="STREAMED", response_body_mode="STREAMED")
    cfg = render(spec)
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    ext_proc["typed_config"]["send_body_without_waiting_for_header_response"] = True
    s.envoy = Envoy(yaml.safe_dump(cfg), s.listen_port, s.admin_port)
    await asyncio.to_thread(s.envoy.start)
    try:
        async with aiohttp.ClientSession() as c:
            body = chat("rewrite me " * 20)
            status, info = await post(c, s.url + "/v1/chat/completions", chunked(body, 64),
                                      {"x-gateway-model-name-rewrite": "llama-2"})
            assert status == 200, info
            assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
            assert info["received_model"] == "llama-2"
            assert info["body_len"] == len(body.replace(b'"model":"llama"', b'"model":"llama-2"'))
            status, info = await post(c, s.url + "/v1/chat/completions", chat("as is"))
            assert status == 200 and info["received_model"] == "llama"
        await until_idle(s)
    finally:
        await s.stop()

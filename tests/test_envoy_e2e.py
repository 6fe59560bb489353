"""End to end through a real Envoy: requests land on the endpoint Pointsman chose, with both Envoy configs."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import orjson
import pytest

from tests.support.backend import EchoFleet
from tests.support.envoy import free_port
from tests.support.stack import Stack
from tests.support.wait import until

pytestmark = pytest.mark.envoy

VARIANTS = ["original-dst", "override-host"]


def chat(content: str = "hello", **extra) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": content}], **extra})


@pytest.fixture(params=VARIANTS)
async def stack(request, tmp_path):
    s = Stack(tmp_path, variant=request.param, epp_flags=("--enable-conformance-header",))
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def post(session: aiohttp.ClientSession, url: str, data, headers=None) -> tuple[int, dict | str]:
    async with session.post(url, data=data, headers={"content-type": "application/json", **(headers or {})}) as r:
        text = await r.read()
        try:
            return r.status, orjson.loads(text)
        except orjson.JSONDecodeError:
            return r.status, text.decode()


async def test_request_lands_on_the_chosen_endpoint_with_routing_headers(stack):
    async with aiohttp.ClientSession() as s:
        seen = set()
        for i in range(12):
            status, info = await post(s, stack.url + "/v1/chat/completions", chat(f"q{i}"))
            assert status == 200, info
            dest = info["headers"]["x-gateway-destination-endpoint"]
            assert dest == f"127.0.0.1:{info['served_by']}", "Envoy must send the request where Pointsman said"
            assert info["headers"]["x-gateway-model-name"] == "llama"
            assert info["headers"]["x-gateway-base-model-name"] == "llama"
            assert info["headers"]["x-ai-eg-model"] == "llama"
            seen.add(info["served_by"])
        assert seen <= set(stack.ports)
        # The conformance header forces each endpoint in turn: the pick really drives Envoy.
        for port in stack.ports:
            status, info = await post(s, stack.url + "/v1/chat/completions", chat(),
                                      {"test-epp-endpoint-selection": f"127.0.0.1:{port}"})
            assert status == 200 and info["served_by"] == port


async def test_body_split_across_many_chunks_arrives_intact(stack):
    body = chat("x" * 300_000)

    async def gen():
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    async with aiohttp.ClientSession() as s:
        status, info = await post(s, stack.url + "/v1/chat/completions", gen())
    assert status == 200, info
    assert info["body_len"] == len(body)
    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()


async def test_8_mib_body(stack):
    body = chat("y" * (8 * 1024 * 1024))
    async with aiohttp.ClientSession() as s:
        status, info = await post(s, stack.url + "/v1/chat/completions", body)
    assert status == 200, str(info)[:300]
    assert info["body_len"] == len(body)
    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()


async def test_headers_only_get_is_routed(stack):
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/models") as r:
        assert r.status == 200
        info = await r.json()
    assert info["method"] == "GET"
    assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"


async def test_invalid_json_is_400_at_the_client(stack):
    async with aiohttp.ClientSession() as s:
        status, text = await post(s, stack.url + "/v1/chat/completions", b'{"model": "llama", "messages": [')
        assert status == 400
        assert text.startswith("inference error: BadRequest - request body is not valid JSON")
        status, text = await post(s, stack.url + "/v1/chat/completions", b'{"messages": [{"role":"user"}]}')
        assert status == 400 and text == "inference error: BadRequest - model not found in request body"


async def test_streamed_sse_response_arrives_intact(stack):
    async with aiohttp.ClientSession() as s:
        async with s.post(stack.url + "/v1/chat/completions", data=chat(stream=True)) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in r.content]
    data = [e.strip() for e in events if e.startswith(b"data:")]
    assert data[-1] == b"data: [DONE]"
    contents = [orjson.loads(d[5:])["choices"][0]["delta"]["content"] for d in data[:5]]
    assert contents == [f"tok{i} " for i in range(5)]
    assert orjson.loads(data[5][5:])["usage"]["completion_tokens"] == 5


async def test_client_sent_destination_header_is_ignored(stack):
    rogue_port = free_port()
    rogue = EchoFleet([rogue_port])
    await rogue.start()
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(6):
                status, info = await post(
                    s, stack.url + "/v1/chat/completions", chat(),
                    {"x-gateway-destination-endpoint": f"127.0.0.1:{rogue_port}",
                     "x-gateway-destination-endpoint-served": f"127.0.0.1:{rogue_port}",
                     "x-prefiller-host-port": f"127.0.0.1:{rogue_port}"},
                )
                assert status == 200
                assert info["served_by"] in stack.ports and info["served_by"] != rogue_port
                assert "x-gateway-destination-endpoint-served" not in info["headers"]
                assert "x-prefiller-host-port" not in info["headers"]
    finally:
        await rogue.stop()


async def test_epp_down_fails_closed_then_recovers(stack):
    async with aiohttp.ClientSession() as s:
        status, _ = await post(s, stack.url + "/v1/chat/completions", chat())
        assert status == 200
        await stack.stop_epp()
        status, info = await post(s, stack.url + "/v1/chat/completions", chat())
        assert status >= 500, "with the EPP down the request must fail, not reach a backend unrouted"
        assert not isinstance(info, dict) or "served_by" not in info
        await stack.start_epp()
        async def served() -> dict | None:
            status, got = await post(s, stack.url + "/v1/chat/completions", chat())
            return got if status == 200 else None

        info = await until(served, 5, "Envoy to reach the restarted EPP", 0.1)
        assert info["served_by"] in stack.ports


@pytest.mark.parametrize("mode", ["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"])
async def test_body_modes_route_and_rewrite_the_model(tmp_path, mode):
    """AI Gateway runs the EPP in BUFFERED mode; the body rewrite must arrive with a matching length."""
    overrides = {"request_body_mode": mode, "response_body_mode": mode}
    s = Stack(tmp_path, variant="original-dst", envoy_overrides=overrides)
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            status, info = await post(c, s.url + "/v1/chat/completions", chat("rewrite me"),
                                      {"x-gateway-model-name-rewrite": "llama-2"})
            assert status == 200, info
            assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
            if mode == "STREAMED":
                # Envoy waits for the header reply before streaming: the pick is made on headers alone,
                # and the body passes through unchanged.
                assert info["received_model"] == "llama"
            else:
                assert info["received_model"] == "llama-2"
                assert info["headers"]["x-gateway-model-name"] == "llama-2"
            status, text = await post(c, s.url + "/v1/chat/completions", b"{broken")
            if mode != "STREAMED":
                assert status == 400 and "BadRequest" in text
    finally:
        await s.stop()


@pytest.mark.parametrize("phases", ["full", "lean"])
async def test_inflight_count_spans_the_whole_response(tmp_path, phases):
    """In-flight must stay counted until the response ends, also in lean mode (response trailers keep the
    ext_proc stream open), and return to zero afterwards."""
    s = Stack(tmp_path, envoy_overrides={"response_phases": phases})
    await s.start()
    try:
        samples: list[int] = []

        async def poll():
            for _ in range(60):
                samples.append(sum(x.requests for x in s.app.datastore.inflight.view().values()))
                await asyncio.sleep(0.002)

        async with aiohttp.ClientSession() as c:
            async def req():
                async with c.post(s.url + "/v1/chat/completions", data=chat(stream=True)) as r:
                    await r.read()

            await asyncio.gather(req(), poll())
            await asyncio.sleep(0.05)
        assert samples.count(1) >= 10, samples  # the ~50 ms stream was counted while it ran
        assert s.app.datastore.inflight.view() == {}
    finally:
        await s.stop()


async def test_envoy_talks_tls_to_a_self_signed_epp(tmp_path):
    """Gateways in Kubernetes talk TLS to the EPP without verifying it: a generated certificate must do."""
    s = Stack(tmp_path, epp_flags=("--secure-serving", "true"), envoy_overrides={"epp_tls": True})
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            status, info = await post(c, s.url + "/v1/chat/completions", chat())
        assert status == 200, info
        assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
    finally:
        await s.stop()


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_long_bodies_arrive_byte_identical_and_routed(tmp_path, mode):
    """Issue 32: bodies of 256 KB and more, whole or in many chunks, reach the endpoint Pointsman picked byte for
    byte (full duplex echoes every chunk from its wire bytes; BUFFERED passes the body untouched)."""
    overrides = {"request_body_mode": mode}
    s = Stack(tmp_path, variant="original-dst", envoy_overrides=overrides)
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            for size, split in ((256 * 1024, 0), (256 * 1024 + 127, 16_383), (1024 * 1024 + 1, 65_537)):
                body = chat("é" + "z" * size + "\u2603")

                async def pieces(body=body, split=split):
                    for i in range(0, len(body), split):
                        yield body[i: i + split]

                status, info = await post(c, s.url + "/v1/chat/completions", pieces() if split else body)
                assert status == 200, str(info)[:300]
                assert info["body_len"] == len(body)
                assert info["body_sha256"] == hashlib.sha256(body).hexdigest()
                assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
                assert info["headers"]["x-gateway-model-name"] == "llama"
    finally:
        await s.stop()


async def test_a_model_named_again_after_the_prompt_never_reaches_the_engine(tmp_path):
    """The decision (full duplex, early, on the prompt's head: a session header names the session up front) reads
    `llama` before the prompt; the body ends with another top-level model, which the engine would serve (JSON's last
    member). Through a real Envoy the client gets a 400 and no engine receives the request; the same body naming
    `llama` twice is served as `llama`. Without the session header the decision waits for the body's end (a session
    may follow the prompt) and reads the model the engine serves: routed, and counted, as that one."""
    s = Stack(tmp_path, variant="original-dst")
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            cases = (("other-adapter", {"x-session-id": "agent-7"}, 400), ("llama", {"x-session-id": "agent-7"}, 200),
                     ("other-adapter", {}, 200))
            for second, headers, want in cases:
                head = chat("w" * 200_000)[:-1]
                body = head + b',"max_tokens":5,"model":' + orjson.dumps(second) + b"}"

                async def pieces(body=body):
                    for i in range(0, len(body), 16_384):
                        yield body[i: i + 16_384]
                        await asyncio.sleep(0.002)

                status, info = await post(c, s.url + "/v1/chat/completions", pieces(), headers=headers)
                assert status == want, str(info)[:300]
                if want == 400:
                    assert "names its model twice" in str(info) and "served_by" not in str(info)
                else:
                    assert isinstance(info, dict) and info["received_model"] == second
                    assert info["headers"]["x-gateway-model-name"] == second
                    assert info["body_sha256"] == hashlib.sha256(body).hexdigest()
    finally:
        await s.stop()


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_a_long_body_with_its_model_after_the_prompt_is_served_whole(tmp_path, mode):
    """As OpenAI's Python client writes it: `messages`, then `model` and the rest. Decided on the head at the body's
    end (the rest scanned once, not parsed), the request reaches the endpoint picked with its body byte for byte,
    routed as the last `model`, `max_tokens` after the prompt seen; a body ending in a model that is not a string
    gets the same 400 as when read whole."""
    s = Stack(tmp_path, variant="original-dst", envoy_overrides={"request_body_mode": mode})
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            prompt = orjson.dumps({"messages": [{"role": "user", "content": "w" * 200_000}]})[:-1]
            for tail, want in ((b',"model":"llama","max_tokens":5}', 200), (b',"model":7}', 400)):
                body = prompt + tail

                async def pieces(body=body):
                    for i in range(0, len(body), 16_384):
                        yield body[i: i + 16_384]
                        await asyncio.sleep(0.002)

                status, info = await post(c, s.url + "/v1/chat/completions", pieces())
                assert status == want, str(info)[:300]
                if want == 400:
                    assert "'model' must be a string" in str(info) and "served_by" not in str(info)
                    continue
                assert isinstance(info, dict) and info["received_model"] == "llama"
                assert info["headers"]["x-gateway-model-name"] == "llama"
                assert info["headers"]["x-gateway-destination-endpoint"] == f"127.0.0.1:{info['served_by']}"
                assert info["body_sha256"] == hashlib.sha256(body).hexdigest()
    finally:
        await s.stop()

"""modelsim's response-path fault injection: fail, stall, reset and a metrics-only hang; recover clears them."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

MODEL = "meta-llama/Llama-3.1-8B"


def chat(stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream}


async def test_fail_answers_generation_with_the_status_while_metrics_stay_up(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/admin/fail?status=502") as r:
            assert (await r.json())["fail_status"] == 502
        async with s.post(f"{url}/v1/chat/completions", json=chat(False)) as r:
            assert r.status == 502 and "injected failure 502" in (await r.json())["message"]
        async with s.get(f"{url}/metrics") as r:
            assert r.status == 200
        async with s.get(f"{url}/admin/state") as r:
            assert (await r.json())["faults"]["fail_status"] == 502
        async with s.post(f"{url}/admin/recover") as r:
            assert r.status == 200
        async with s.post(f"{url}/v1/chat/completions", json=chat(False)) as r:
            assert r.status == 200


async def test_stall_sends_headers_and_a_chunk_then_silence_until_recover(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        await (await s.post(f"{url}/admin/stall?after=2")).release()
        async with s.post(f"{url}/v1/chat/completions", json=chat(True)) as r:
            assert r.status == 200
            first = await r.content.readuntil(b"\n\n")
            second = await r.content.readuntil(b"\n\n")
            assert first.startswith(b"data: ") and b"tok1" in second
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), 0.3)  # silent
            await (await s.post(f"{url}/admin/recover")).release()
            rest = await asyncio.wait_for(r.content.read(), 2)
            assert rest.endswith(b"data: [DONE]\n\n")
        # recovered: answered normally (under the stall a plain request gets no answer at all)
        plain = await asyncio.wait_for(s.post(f"{url}/v1/chat/completions", json=chat(False)), 5)
        assert plain.status == 200
        plain.release()


async def test_reset_cuts_the_stream_and_aborts_plain_requests(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        await (await s.post(f"{url}/admin/reset?after=1")).release()
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(f"{url}/v1/chat/completions", json=chat(True)) as r:
                assert r.status == 200
                await r.read()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.post(f"{url}/v1/chat/completions", json=chat(False)) as r:
                await r.read()
        await (await s.post(f"{url}/admin/recover")).release()
        async with s.post(f"{url}/v1/chat/completions", json=chat(True)) as r:
            assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")


async def test_metrics_only_hang(make_fleet) -> None:
    fleet = await make_fleet(1, time_scale=0.05)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        await (await s.post(f"{url}/admin/hang?what=metrics")).release()
        scrape = asyncio.ensure_future(s.get(f"{url}/metrics"))
        async with s.post(f"{url}/v1/chat/completions", json=chat(False)) as r:
            assert r.status == 200  # requests are served
        # A window in which nothing may happen: the scrape, sent before the request just answered, stays unanswered.
        done, _ = await asyncio.wait({scrape}, timeout=0.1)
        assert not done
        await (await s.post(f"{url}/admin/recover")).release()
        resp = await asyncio.wait_for(scrape, 2)
        assert resp.status == 200
        resp.release()
        async with s.post(f"{url}/admin/hang?what=disk") as r:
            assert r.status == 400

"""Passive and scrape health end to end: real Envoy, `epp serve` as a process, modelsim's fault injection.

What an operator sees is checked through the public surface: the client's status codes, `epp endpoints --json`
and Pointsman's /metrics.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from tests.support.simstack import MODEL, SimStack
from tests.support.wait import seconds_until

pytestmark = [pytest.mark.realtime, pytest.mark.envoy]


RANDOM = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: random-picker}
"""  # every server gets its share of the requests, so each test's faulty server is hit


def body(stream: bool = False, n: int = 0) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"question {n}"}], "max_tokens": 4,
            "stream": stream}


async def endpoints(s: SimStack) -> dict[str, dict]:
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "epp.cmd.cli", "endpoints", "--addr",
                                                   f"127.0.0.1:{s.epp_port}", "--json"],
                                  capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {e["key"]: e for e in json.loads(out.stdout)["endpoints"]}


async def until_state(s: SimStack, i: int, states: tuple[str, ...], timeout: float = 10.0) -> float:
    """Seconds until server i is in one of `states` (polled over Pointsman's API every 20 ms)."""
    seen: list[str] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{s.epp_port}") as ch:
        stub = pointsman_pb2_grpc.PointsmanStub(ch)

        async def in_state() -> bool:
            resp = await stub.ListEndpoints(api.ListEndpointsRequest())
            seen.append(next(e.state for e in resp.endpoints if e.key == s.key(i)))
            return seen[-1] in states

        return await seconds_until(in_state, timeout, lambda: f"server {i} to become {states} (it is {seen[-1:]})")


async def admin(c: aiohttp.ClientSession, s: SimStack, i: int, what: str) -> None:
    async with c.post(s.server_url(i) + what) as r:
        assert r.status == 200, await r.text()


async def post(c: aiohttp.ClientSession, s: SimStack, n: int, stream: bool = False) -> tuple[int, str | None]:
    async with c.post(s.url + "/v1/chat/completions", json=body(stream, n)) as r:
        await r.read()
        return r.status, r.headers.get("x-inference-port")


async def test_failing_responses_take_a_server_out_and_a_probe_brings_it_back():
    # The cool-down outlasts what follows the ejection (24 requests, an `epp endpoints`, a scrape of /metrics) even on
    # a loaded machine, so the endpoint is still out when they look.
    s = SimStack(3, epp_flags=("--passive-failure-threshold", "3", "--passive-cooldown", "8s"), config_text=RANDOM)
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            await admin(c, s, 0, "/admin/fail?status=503")
            results = [await post(c, s, n) for n in range(12)]
            failed = [r for r in results if r[0] != 200]
            assert failed and len(failed) <= 3, results  # 3 in a row take it out; scraping alone never would
            # Looked at right away, well inside the cool-down even on a loaded machine.
            info = (await endpoints(s))[s.key(0)]
            assert info["state"] == "ejected" and info["reason"].startswith("HTTP 503")
            assert info["failures"] == len(failed) and info["ejections"] == 1 and not info.get("routable", False)
            async with c.get(f"http://127.0.0.1:{s.metrics_port}/metrics") as r:
                text = await r.text()
            assert (f'pointsman_endpoint_response_failures_total{{endpoint="{s.key(0)}",reason="http_5xx"}} '
                    f'{float(len(failed))}') in text
            assert f'pointsman_endpoint_state{{endpoint="{s.key(0)}",state="ejected"}} 1.0' in text
            more = [await post(c, s, 12 + n) for n in range(12)]
            assert all(st == 200 and port != str(s.ports[0]) for st, port in more)
            # The server recovers; after the cool-down one request probes it, and it is back.
            await admin(c, s, 0, "/admin/recover")
            await until_state(s, 0, ("probing",), timeout=12)
            ports = [(await post(c, s, 100 + n))[1] for n in range(30)]
            assert str(s.ports[0]) in ports
            assert (await endpoints(s))[s.key(0)]["state"] == "healthy"
    finally:
        await s.stop()


async def test_silent_streams_take_a_server_out():
    s = SimStack(2, epp_flags=("--passive-failure-threshold", "2", "--passive-silence-timeout", "1s"),
                 config_text=RANDOM)
    await s.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=6)) as c:
            await admin(c, s, 0, "/admin/stall?after=1")  # headers and a chunk, then nothing
            stalled = [asyncio.ensure_future(post(c, s, n, stream=True)) for n in range(8)]
            waited = await until_state(s, 0, ("ejected",), timeout=5)
            assert 1.0 < waited < 3.0
            info = (await endpoints(s))[s.key(0)]
            assert info["reason"].startswith("no response for 1.")
            results = [await post(c, s, 100 + n, stream=True) for n in range(10)]
            assert all(st == 200 and port == str(s.ports[1]) for st, port in results)
            await admin(c, s, 0, "/admin/recover")
            await asyncio.gather(*stalled, return_exceptions=True)
    finally:
        await s.stop()


async def test_killed_and_hung_servers_are_out_fast():
    s = SimStack(3, config_text=RANDOM)
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            # Killed: connection refused, on scrapes and on requests.
            await admin(c, s, 1, "/admin/kill")  # it dies 50 ms after answering
            t0 = time.monotonic()
            results = []
            while time.monotonic() - t0 < 2.0:
                results.append((time.monotonic() - t0, *await post(c, s, len(results))))
            failed = [t for t, st, _ in results if st != 200]
            # Out within a few scrape rounds (the requests that reached it before fail; random picks may send it
            # none), then every request succeeds.
            assert not failed or max(failed) < 1.0, results
            assert all(st == 200 for t, st, _ in results if t > 1.0), results
            assert (await endpoints(s))[s.key(1)]["state"] in ("out", "ejected")
            # Metrics hang (the server still answers requests): out within the 2 s staleness threshold.
            await admin(c, s, 2, "/admin/hang?what=metrics")
            took = await until_state(s, 2, ("out",), timeout=4)
            print(f"metrics hang: out after {took:.2f} s")
            assert took < 2.0, took
            assert "TimeoutError" in (await endpoints(s))[s.key(2)]["reason"]
            await admin(c, s, 2, "/admin/recover")
            await until_state(s, 2, ("healthy",), timeout=3)
    finally:
        await s.stop()


GIE_PROFILE = (Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "gie-default.yaml").read_text()
SHARED = "the same long system prompt " * 600  # ~4,200 tokens: a cold prefill the profiles avoid


@pytest.mark.parametrize("profile", ["default", "gie"])
async def test_a_recovered_server_gets_its_probe_within_the_cooldown_whatever_the_profile(profile):
    """Identical prompts: every profile keeps them on the server that holds their prefix. The other server fails,
    is ejected and recovers; nothing would ever route an identical prompt to it, yet it gets its probe (the next
    request after its cool-down) and is back in rotation within the cool-down plus a second."""
    cooldown = 2.0
    s = SimStack(2, epp_flags=("--passive-failure-threshold", "3", "--passive-cooldown", f"{cooldown:g}s"),
                 config_text=GIE_PROFILE if profile == "gie" else None)
    await s.start()
    stop = asyncio.Event()
    ports: list[str | None] = []

    async def identical(c: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": SHARED}], "max_tokens": 2}
        while not stop.is_set():
            async with c.post(s.url + "/v1/chat/completions", json=body) as r:
                await r.read()
                ports.append(r.headers.get("x-inference-port"))

    try:
        async with aiohttp.ClientSession() as c:
            await identical_once(c, s)
            holder = holder_of(s)
            other = 1 - holder
            await admin(c, s, other, "/admin/fail?status=503")
            for n in range(3):  # the other server fails three requests sent to it: out for the cool-down
                async with c.post(s.url + "/v1/chat/completions", json=body(False, n),
                                  headers={"test-epp-endpoint-selection": s.key(other)}) as r:
                    assert r.status == 503
            await until_state(s, other, ("ejected",), timeout=5)
            ejected_at = time.monotonic()
            await admin(c, s, other, "/admin/recover")
            load = asyncio.ensure_future(identical(c))
            took = await until_state(s, other, ("healthy",), timeout=cooldown + 5)
            back = time.monotonic() - ejected_at
            stop.set()
            await load
        assert back <= cooldown + 1.0, f"back in rotation {back:.2f} s after the ejection ({took:.2f} s of polling)"
        assert str(s.ports[other]) in ports, "its probe was a real request"
        assert ports.count(str(s.ports[holder])) > ports.count(str(s.ports[other])), "the profile still decides"
    finally:
        stop.set()
        await s.stop()


async def identical_once(c: aiohttp.ClientSession, s: SimStack) -> None:
    """A few identical requests, so that one server holds the prompt (and Pointsman knows it)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": SHARED}], "max_tokens": 2}
    for _ in range(3):
        async with c.post(s.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            await r.read()


def holder_of(s: SimStack) -> int:
    """The server that holds the prompt: the one that served the identical requests."""
    served = [s.fleet.servers[i].engine.stats.prompt_tokens for i in range(2)]
    return 0 if served[0] >= served[1] else 1

"""Drives a planned workload against one URL and measures it from the client side.

TTFT is the arrival of the first streamed body bytes after the request is sent; output and cached
tokens come from the final usage chunk (stream_options.include_usage). Times are converted to model
seconds by dividing by the fleet's time scale. After a stage, `fill_engine_ttfts` adds each request's TTFT as
its engine recorded it (modelsim's own records, matched on the request's x-request-id): the client's TTFT minus
the engine's is the time the request spent on its way there and back, the router's hop included.

A planned request with SLOs (model seconds) is sent with `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (or the plain
`x-slo-ttft-ms` / `x-slo-tpot-ms` of llm-d's predicted-latency scheduling, `SLO_HEADERS["plain"]`; or none, to measure
a router without them) in *wall* milliseconds (model × time scale, rounded to a whole millisecond as llm-d parses
integers), since that is the clock the router runs on; whether it met them is judged in model time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench.routing.workload import Planned


@dataclass
class Result:
    group: int
    status: int
    ttft: float | None  # model seconds
    e2e: float | None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    pod: str = ""
    error: str = ""
    direct: bool = False  # sent straight to a server, bypassing the router (the outside-traffic regime)
    slo_ttft: float | None = None  # model seconds
    slo_tpot: float | None = None
    tight: bool = False
    at: float = 0.0  # when it was planned to arrive, model seconds from the stage's start
    request_id: str = ""  # the x-request-id it was sent with
    engine_ttft: float | None = None  # model seconds from its arrival at the engine to its first token (fill_engine_ttfts)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft is not None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (model seconds)."""
        if not self.ok or self.e2e is None or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def met_ttft(self) -> bool:
        """Succeeded within its TTFT SLO."""
        return self.ok and self.ttft is not None and self.slo_ttft is not None and self.ttft <= self.slo_ttft

    @property
    def met_slo(self) -> bool:
        """Succeeded within its TTFT SLO and, when it has one, its TPOT SLO."""
        if not self.met_ttft:
            return False
        tpot = self.tpot
        return self.slo_tpot is None or (tpot is not None and tpot <= self.slo_tpot)


SLO_TTFT_HEADER, SLO_TPOT_HEADER = "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"
# which names the SLOs travel under: llm-d's current ones, the plain ones, or none at all (judged all the same)
SLO_HEADERS: dict[str, tuple[str, str] | None] = {
    "llm-d": (SLO_TTFT_HEADER, SLO_TPOT_HEADER), "plain": ("x-slo-ttft-ms", "x-slo-tpot-ms"), "none": None}
_ids = itertools.count(1)


def request_headers(p: Planned, scale: float, names: tuple[str, str] | None = SLO_HEADERS["llm-d"]) -> dict[str, str]:
    """Content type, a unique x-request-id (modelsim records it), and the SLO headers (`names`: TTFT, TPOT; None
    sends none) in wall milliseconds."""
    h = {"content-type": "application/json", "x-request-id": f"bench-{next(_ids)}"}
    if names is None:
        return h
    if p.slo_ttft is not None:
        h[names[0]] = str(max(1, round(p.slo_ttft * 1000 * scale)))
    if p.slo_tpot is not None:
        h[names[1]] = str(max(1, round(p.slo_tpot * 1000 * scale)))
    return h


def _usage_from_tail(tail: bytes) -> dict | None:
    idx = tail.rfind(b'"usage"')
    if idx < 0:
        return None
    start = tail.rfind(b"data: ", 0, idx)
    end = tail.find(b"\n", idx)
    if start < 0 or end < 0:
        return None
    try:
        return orjson.loads(tail[start + 6 : end]).get("usage")
    except orjson.JSONDecodeError:
        return None


async def _one(session: aiohttp.ClientSession, url: str, p: Planned, scale: float, timeout: float,
               direct: bool = False, names: tuple[str, str] | None = SLO_HEADERS["llm-d"]) -> Result:
    headers = request_headers(p, scale, names)
    r = await _send(session, url, p, scale, timeout, headers)
    r.direct, r.slo_ttft, r.slo_tpot, r.tight, r.at = direct, p.slo_ttft, p.slo_tpot, p.tight, p.at
    r.request_id = headers["x-request-id"]
    return r


async def _send(session: aiohttp.ClientSession, url: str, p: Planned, scale: float, timeout: float,
                headers: dict[str, str]) -> Result:
    t0 = time.monotonic()
    ttft = None
    tail = b""
    try:
        async with session.post(url, data=orjson.dumps(p.body), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                text = (await resp.read())[:200].decode(errors="replace")
                return Result(p.group, resp.status, None, None, error=text)
            pod = resp.headers.get("x-inference-pod", "")
            async for chunk in resp.content.iter_any():
                if ttft is None:
                    ttft = (time.monotonic() - t0) / scale
                tail = (tail + chunk)[-4096:]
            e2e = (time.monotonic() - t0) / scale
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Result(p.group, 0, None, None, error=f"{type(exc).__name__}: {exc}")
    u = _usage_from_tail(tail) or {}
    return Result(p.group, 200, ttft, e2e, u.get("prompt_tokens", 0), u.get("completion_tokens", 0),
                  (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0, pod)


async def run_stage(url: str, plan: list[Planned], time_scale: float, request_timeout: float = 120.0,
                    stage_timeout: float = 600.0, direct: dict[int, str] | None = None,
                    slo_headers: str = "llm-d") -> tuple[list[Result], float]:
    """Send every planned request at its arrival time; returns the results and the stage's model duration.

    `direct` maps plan indexes to the server URL (…/v1/chat/completions) that request goes to instead of `url`:
    traffic that bypasses the router. Bounded: each request by `request_timeout` and the whole stage by
    `stage_timeout` (wall seconds); requests still running at the stage deadline are cancelled and counted as errors.
    `slo_headers` names the SLO headers sent (`SLO_HEADERS`: llm-d, plain, none).
    """
    direct = direct or {}
    names = SLO_HEADERS[slo_headers]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.monotonic()

        async def fire(i: int, p: Planned) -> Result:
            delay = start + p.at * time_scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            target = direct.get(i)
            return await _one(session, target or url, p, time_scale, request_timeout, target is not None, names)

        tasks = [asyncio.ensure_future(fire(i, p)) for i, p in enumerate(plan)]
        done, pending = await asyncio.wait(tasks, timeout=stage_timeout)
        for t in pending:
            t.cancel()
        results = [t.result() for t in tasks if t in done]
        results += [Result(-1, 0, None, None, error="stage deadline", direct=i in direct, slo_ttft=p.slo_ttft,
                           slo_tpot=p.slo_tpot, tight=p.tight, at=p.at)
                    for i, (t, p) in enumerate(zip(tasks, plan, strict=True)) if t in pending]
        elapsed = (time.monotonic() - start) / time_scale
    return results, elapsed


async def server_records(server_urls: Sequence[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Every server's own records of the requests it finished (modelsim's GET /admin/requests), as (pod, record);
    a server that does not answer is skipped."""
    async with aiohttp.ClientSession() as http:
        for u in server_urls:
            try:
                async with http.get(f"{u}/admin/requests", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    data = await r.json(loads=orjson.loads)
            except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError):
                continue
            pod = data.get("pod", "")
            for rec in data.get("records", ()):
                yield pod, rec


async def fill_engine_ttfts(results: list[Result], server_urls: Sequence[str]) -> None:
    """Each successful request's TTFT as its engine recorded it (`Result.engine_ttft`, model seconds)."""
    wanted = {r.request_id: r for r in results if r.ok and r.request_id}
    if not wanted:
        return
    async for _, rec in server_records(server_urls):
        r = wanted.get(rec.get("request_id", ""))
        ttft = rec.get("ttft")
        if r is not None and ttft is not None:
            r.engine_ttft = float(ttft)

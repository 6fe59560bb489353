"""An oracle router: reads each simulated server's true cache and queue state, then forwards.

For every request it POSTs the body to every backend's ``/admin/probe`` (modelsim's admin endpoint: the
prefix-cache hit the request would get now, plus running/waiting counts and the latency profile), and
picks the backend with the lowest predicted cost: this request's latency plus the slowdown it imposes on
the requests already running there (modelsim's latency model, see modelsim/engine.py):

    r      = running + requests this oracle sent there that have not produced a byte yet
    load   = 1 + (F − 1) · r / (max_num_seqs − 1)                 (r + 1 running after admission)
    queue  = max(0, r + waiting + 1 − max_num_seqs) · max_tokens · itl · F / max_num_seqs
    own    = (overhead + (prompt − cached) · per_token) · load + max_tokens · itl · load
    others = r · (max_tokens / 2) · itl · (F − 1) / (max_num_seqs − 1)
    cost   = queue + own + others

Run: python -m bench.routing.oracle --port 8500 --backend http://127.0.0.1:8100 --backend ...
Probing costs one loopback round trip per request (in wall time, so 1/time_scale more in model time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
from aiohttp import web

_API = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages"}


def predicted_cost(st: dict[str, Any], pending: int, max_tokens: int) -> float:
    m = max(1, st["max_num_seqs"])
    r = st["running"] + pending
    f = st["load_factor"]
    load = 1.0 + (f - 1.0) * r / max(1, m - 1)
    excess = max(0, r + st["waiting"] + 1 - m)
    queue = excess * max_tokens * st["itl"] * f / m
    load = min(load, f)
    prefill = (st["prefill_overhead"] + (st["prompt_tokens"] - st["cached_tokens"]) * st["prefill_per_token"])
    own = prefill * load + max_tokens * st["itl"] * load
    others = r * (max_tokens / 2) * st["itl"] * (f - 1.0) / max(1, m - 1)
    return queue + own + others


class Oracle:
    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.pending = {b: 0 for b in backends}
        self.session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _probe(self, backend: str, api: str, raw: bytes) -> dict[str, Any] | None:
        assert self.session is not None
        try:
            async with self.session.post(f"{backend}/admin/probe?api={api}", data=raw,
                                         timeout=aiohttp.ClientTimeout(total=2)) as r:
                return await r.json(loads=orjson.loads) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def choose(self, api: str, raw: bytes, max_tokens: int) -> str:
        states = await asyncio.gather(*(self._probe(b, api, raw) for b in self.backends))
        best, best_cost = self.backends[0], float("inf")
        for b, st in zip(self.backends, states, strict=True):
            if st is None:
                continue
            c = predicted_cost(st, self.pending[b], max_tokens)
            if c < best_cost:
                best, best_cost = b, c
        return best

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        raw = await request.read()
        api = _API.get(request.path)
        backend = self.backends[0]
        if api is not None:
            try:
                mt = int(orjson.loads(raw).get("max_tokens") or 16)
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                mt = 16
            backend = await self.choose(api, raw, mt)
        self.pending[backend] += 1
        first = True
        try:
            async with self.session.request(request.method, backend + request.path_qs, data=raw,
                                            headers={"content-type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status)
                for k in ("content-type", "x-inference-pod", "x-inference-port"):
                    if k in up.headers:
                        resp.headers[k] = up.headers[k]
                async for chunk in up.content.iter_any():
                    if first:
                        self.pending[backend] -= 1
                        first = False
                        await resp.prepare(request)
                    await resp.write(chunk)
                if first:
                    await resp.prepare(request)
                await resp.write_eof()
                return resp
        finally:
            if first:
                self.pending[backend] -= 1


def build_app(backends: list[str]) -> web.Application:
    o = Oracle(backends)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(o.start)
    app.on_cleanup.append(o.stop)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", o.handle)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True, help="a modelsim server URL (repeat)")
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(build_app(args.backend), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()

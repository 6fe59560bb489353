"""The HTTP-proxy oracle (router `oracle-proxy`): reads the simulated servers' true state, then forwards.

For every request it POSTs the body once to modelsim's ``/admin/fleet/probe`` (on any server of the fleet
process: the prefix-cache hit the request would get now on every server, their running/waiting counts,
free blocks and latency profile) and picks the server with the lowest `modelsim.oracle.predicted_cost`,
counting the requests it routed whose reply headers have not come back yet as running.

The router `oracle` is the in-process variant (`modelsim --oracle-port`): same cost, no proxy hop and no
staleness. This one exists to measure what a probe round trip and a Python proxy cost.

Run: python -m bench.routing.oracle --port 8500 --backend http://127.0.0.1:8100 --backend ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from modelsim.oracle import predicted_cost

_API = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages"}


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

    async def _probe(self, api: str, raw: bytes) -> list[dict[str, Any]]:
        assert self.session is not None
        for backend in self.backends:  # any live server of the fleet process answers for all
            try:
                async with self.session.post(f"{backend}/admin/fleet/probe?api={api}", data=raw,
                                             timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return (await r.json(loads=orjson.loads))["servers"]
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
        return []

    async def choose(self, api: str, raw: bytes, max_tokens: int) -> str:
        best, best_cost = self.backends[0], float("inf")
        for st in await self._probe(api, raw):
            b = st["url"]
            if b not in self.pending:
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
        # modelsim sends streaming headers once the request is queued in the engine, after which the
        # probe's running/waiting counts include it.
        self.pending[backend] += 1
        counted = True
        try:
            async with self.session.request(request.method, backend + request.path_qs, data=raw,
                                            headers={"content-type": "application/json"}) as up:
                self.pending[backend] -= 1
                counted = False
                resp = web.StreamResponse(status=up.status)
                for k in ("content-type", "x-inference-pod", "x-inference-port"):
                    if k in up.headers:
                        resp.headers[k] = up.headers[k]
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        finally:
            if counted:
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

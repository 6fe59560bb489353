"""Model servers that hold requests: each request is answered after `delay` seconds, or when the test releases
them; the fleet counts what is in flight at each server (the truth a router's view is checked against)."""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson
from aiohttp import web

METRICS = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="llama"} 0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="llama"} 0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="llama"} 0.0\n'
)


class HoldingFleet:
    def __init__(self, ports: list[int], delay: float | None = None) -> None:
        self.ports = ports
        self.delay = delay  # None: hold until release()
        self.inflight: Counter[int] = Counter()
        self.served: Counter[int] = Counter()
        self._release = asyncio.Event()
        self.runners: list[web.AppRunner] = []

    def release(self) -> None:
        self._release.set()

    def hold(self) -> None:
        self._release = asyncio.Event()

    def _app(self, port: int) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:  # an idle vLLM server's, so the scraper keeps it in
            return web.Response(text=METRICS, content_type="text/plain")

        async def handle(request: web.Request) -> web.StreamResponse:
            await request.read()
            self.inflight[port] += 1
            try:
                if self.delay is None:
                    await self._release.wait()
                else:
                    await asyncio.sleep(self.delay)
            finally:
                self.inflight[port] -= 1
            self.served[port] += 1
            return web.Response(body=orjson.dumps({"served_by": port}), content_type="application/json",
                                headers={"x-served-by": str(port)})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    async def start(self) -> None:
        for port in self.ports:
            runner = web.AppRunner(self._app(port), access_log=None, shutdown_timeout=0.5)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

    async def stop(self) -> None:
        self.release()
        for r in self.runners:
            await r.cleanup()

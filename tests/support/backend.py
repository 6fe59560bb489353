"""A tiny echo model server for the Envoy tests: reports which port served the request and what it received."""

from __future__ import annotations

import asyncio
import hashlib

import orjson
from aiohttp import web


def make_app(port: int) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        info = {
            "served_by": port,
            "method": request.method,
            "path": request.path,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_len": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        stream = False
        if body:
            try:
                parsed = orjson.loads(body)
                stream = isinstance(parsed, dict) and bool(parsed.get("stream"))
                info["received_model"] = parsed.get("model") if isinstance(parsed, dict) else None
            except orjson.JSONDecodeError:
                pass
        hdrs = {"x-served-by": str(port)}
        if not stream:
            info["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
            return web.json_response(info, headers=hdrs, dumps=lambda o: orjson.dumps(o).decode())
        resp = web.StreamResponse(headers={**hdrs, "content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(5):
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": info.get("received_model"),
                     "choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(0.01)
        usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}
        await resp.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await resp.write(b"data: " + orjson.dumps({"served_by": port}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{{model_name="llama"}} 0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{{model_name="llama"}} 0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{{model_name="llama"}} 0.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class EchoFleet:
    """N echo servers on loopback ports, in the current event loop."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.runners: list[web.AppRunner] = []

    async def start(self) -> None:
        for port in self.ports:
            runner = web.AppRunner(make_app(port), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

    async def stop(self) -> None:
        for r in self.runners:
            await r.cleanup()

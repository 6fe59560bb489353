"""Response-path fault injection for one simulated server (health drills), on top of kill and hang.

Each fault applies to generation requests only (chat, completions, messages, responses): /metrics, /health and
the admin endpoints keep answering, so a scraper sees a healthy server while its responses fail, which is what
passive health must catch. `POST /admin/recover` clears every fault.

* ``POST /admin/fail?status=503``  every generation request is answered with that status (OpenAI error body).
* ``POST /admin/stall[?after=N]``  streaming requests get their headers and N chunks (default 1), then silence
  until recover or kill; non-streaming requests get no answer at all.
* ``POST /admin/reset[?after=N]``  streaming requests get their headers and N chunks (default 1), then the
  connection is aborted (a TCP reset); non-streaming requests are aborted before any answer.
* ``POST /admin/hang?what=metrics`` only /metrics blocks (until recover); `what=all` (the default) is the
  server-wide hang of ``modelsim.admin``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from modelsim import api as A

GENERATION_PATHS = frozenset(A.PATH_API)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Faults:
    fail_status: int = 0
    stall_after: int | None = None
    reset_after: int | None = None
    metrics_hung: bool = False
    recovered: asyncio.Event = field(default_factory=asyncio.Event)

    def clear(self) -> None:
        self.fail_status = 0
        self.stall_after = self.reset_after = None
        self.metrics_hung = False
        self.recovered.set()
        self.recovered = asyncio.Event()

    def describe(self) -> dict[str, Any]:
        return {"fail_status": self.fail_status or None, "stall_after": self.stall_after,
                "reset_after": self.reset_after, "metrics_hung": self.metrics_hung}


def _chunk(i: int) -> bytes:
    data = {"id": "stalled", "object": "chat.completion.chunk", "created": int(time.time()), "model": "modelsim",
            "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _partial(request: web.Request, faults: Faults, after: int, reset: bool) -> web.StreamResponse:
    body = await request.read()
    try:
        stream = bool(orjson.loads(body).get("stream"))
    except (orjson.JSONDecodeError, AttributeError):
        stream = False
    waiting = faults.recovered
    if not stream:
        if reset and request.transport is not None:
            request.transport.abort()
            raise ConnectionResetError("injected reset")
        await waiting.wait()
        return web.json_response({"error": "recovered from an injected stall"}, status=503)
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(after):
        await resp.write(_chunk(i))
    if reset:
        await asyncio.sleep(0.01)  # let the chunks leave before the reset
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("injected reset")
    await waiting.wait()
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def add_fault_routes(app: web.Application, on_recover: Callable[[], None] | None = None) -> Faults:
    """Register the fault endpoints and the middleware that applies them; returns the server's fault state."""
    faults = Faults()

    @web.middleware
    async def apply(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path == "/metrics" and faults.metrics_hung:
            await faults.recovered.wait()
        elif request.method == "POST" and path in GENERATION_PATHS:
            if faults.fail_status:
                api = A.PATH_API[path]
                status = faults.fail_status
                return web.json_response(A.error_body(status, f"injected failure {status} (/admin/fail)", api),
                                         status=status)
            if faults.reset_after is not None:
                return await _partial(request, faults, faults.reset_after, reset=True)
            if faults.stall_after is not None:
                return await _partial(request, faults, faults.stall_after, reset=False)
        return await handler(request)

    def _after(request: web.Request) -> int:
        return max(0, int(request.query.get("after", "1")))

    async def fail(request: web.Request) -> web.Response:
        try:
            status = int(request.query.get("status", "503"))
        except ValueError:
            return web.json_response({"error": "status must be an HTTP status code"}, status=400)
        faults.fail_status = status
        return web.json_response(faults.describe())

    async def stall(request: web.Request) -> web.Response:
        faults.stall_after = _after(request)
        return web.json_response(faults.describe())

    async def reset(request: web.Request) -> web.Response:
        faults.reset_after = _after(request)
        return web.json_response(faults.describe())

    app.middlewares.append(apply)
    app.router.add_post("/admin/fail", fail)
    app.router.add_post("/admin/stall", stall)
    app.router.add_post("/admin/reset", reset)
    return faults

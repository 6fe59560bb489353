"""Turning engine token events into HTTP replies (SSE streams or one JSON body)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from modelsim import api as A
from modelsim import tokenizer as tk
from modelsim.engine import Event, Seq

if TYPE_CHECKING:
    from modelsim.server import SimServer


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


async def _next_batch(queue: asyncio.Queue[Event]) -> list[Event]:
    """Wait for one event, then take whatever else is already queued."""
    batch = [await queue.get()]
    while not queue.empty():
        batch.append(queue.get_nowait())
    return batch


async def run_generation(
    srv: SimServer, request: web.Request, p: A.ParsedRequest, rid: str, seq: Seq, queue: asyncio.Queue[Event]
) -> web.StreamResponse:
    created = int(time.time())
    if not p.stream:
        done = False
        while not done:
            done = any(kind == "finish" for kind, _, _ in await _next_batch(queue))
        n = seq.generated
        ktp = srv.transfer_params(p, len(seq.req.prompt_tokens) // srv.fleet.engine.block_size + 1)
        body = A.full_body(p, rid, created, A.output_text(0, n), n, seq.cached_tokens,
                           seq.finish_reason or "length", ktp)
        return web.Response(body=orjson.dumps(body), content_type="application/json", headers=srv.reply_headers())

    resp = web.StreamResponse(status=200, headers={
        **srv.reply_headers(), "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
    })
    await resp.prepare(request)
    sent = 0
    first = True
    if p.api == tk.API_MESSAGES:
        await resp.write(b"".join(_sse(d, e) for e, d in A.anthropic_events_start(p, rid, seq.cached_tokens)))
    elif p.api == tk.API_RESPONSES:
        await resp.write(_sse({"type": "response.created", "response": {"id": f"resp_{rid}", "status":
                                                                          "in_progress", "model": p.model}},
                              "response.created"))
    while True:
        batch = await _next_batch(queue)
        finished = any(kind == "finish" for kind, _, _ in batch)
        upto = seq.generated  # events are delivered in the same tick the engine counts them
        out = bytearray()
        if upto > sent:
            text = A.output_text(sent, upto)
            if p.api == tk.API_MESSAGES:
                e, d = A.anthropic_delta(text)
                out += _sse(d, e)
            elif p.api == tk.API_RESPONSES:
                out += _sse({"type": "response.output_text.delta", "item_id": f"msg_{rid}", "output_index": 0,
                             "content_index": 0, "delta": text}, "response.output_text.delta")
            else:
                out += _sse(A.openai_chunk(p, rid, created, text, None, first=first))
            first = False
            sent = upto
        if finished:
            out += _finish(srv, p, rid, created, seq)
        if out:
            await resp.write(bytes(out))
        if finished:
            break
        if srv.fleet.stream_interval > 0:
            await asyncio.sleep(srv.fleet.stream_interval)
    await resp.write_eof()
    return resp


def _finish(srv: SimServer, p: A.ParsedRequest, rid: str, created: int, seq: Seq) -> bytes:
    reason = seq.finish_reason or "length"
    n = seq.generated
    if p.api == tk.API_MESSAGES:
        return b"".join(_sse(d, e) for e, d in A.anthropic_events_end(reason, n))
    if p.api == tk.API_RESPONSES:
        body = A.full_body(p, rid, created, A.output_text(0, n), n, seq.cached_tokens, reason, None)
        return _sse({"type": "response.completed", "response": body}, "response.completed")
    ktp = srv.transfer_params(p, len(seq.req.prompt_tokens) // srv.fleet.engine.block_size + 1)
    out = _sse(A.openai_chunk(p, rid, created, "", reason))
    if p.include_usage:
        out += _sse(A.openai_usage_chunk(p, rid, created, n, seq.cached_tokens, ktp))
    elif ktp is not None:
        out += _sse({**A.openai_chunk(p, rid, created, None, None), "choices": [], "kv_transfer_params": ktp})
    return out + b"data: [DONE]\n\n"

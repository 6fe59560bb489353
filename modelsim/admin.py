"""Admin endpoints of one simulated server: failure injection and the oracle's view of the truth.

* ``GET  /admin/state``          engine state (queue, running, KV usage, free/cached blocks, counters).
* ``GET  /admin/requests[?since=N]`` the server's record of the requests it finished (or aborted) after record N,
  each with its exact model-time timeline (modelsim.records): the ground truth for timing learners.
* ``POST /admin/probe?api=chat`` body = a generation request body (api: chat, completions, messages,
  responses); returns the prefix-cache hit the request would get *now* (``cached_tokens``), its
  ``prompt_tokens``, and the engine state. No side effects.
* ``POST /admin/fleet/probe?api=chat`` the same for every server of this process, in one round trip:
  ``{"servers": [{"url": ..., "cached_tokens": ..., ...}, ...]}``.
* ``POST /admin/kill[?seconds=S]`` stop listening and drop in-flight requests; listen again after S
  seconds (wall time) if given, else stay dead.
* ``POST /admin/hang``           every non-admin request blocks until ``POST /admin/recover``
  (``?what=metrics``: only /metrics blocks).
* ``POST /admin/recover``        end a hang and clear every injected fault.
* ``POST /admin/fail``, ``/admin/stall``, ``/admin/reset``: response-path faults (``modelsim.faults``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from modelsim import tokenizer as tk
from modelsim.faults import add_fault_routes

if TYPE_CHECKING:
    from modelsim.server import SimServer


def engine_state(srv: SimServer) -> dict[str, Any]:
    e = srv.engine
    st = e.stats
    return {
        "pod": srv.pod, "port": srv.port, "role": srv.role,
        "waiting": len(e.waiting), "running": len(e.running), "max_num_seqs": e.cfg.max_num_seqs,
        "kv_usage": e.kv.usage, "free_blocks": e.kv.free, "cached_blocks": e.kv.cached_blocks,
        "capacity_blocks": e.kv.capacity, "block_size": e.cfg.block_size,
        "fresh_blocks": e.kv.fresh, "evictions": e.kv.evictions, "preemptions": st.preemptions,
        "prefix_queries": st.prefix_queries, "prefix_hits": st.prefix_hits,
        "active_loras": e.active_loras(), "hung": not srv.unhung.is_set(),
        "model_time": srv.driver.now() if srv.driver is not None else 0.0,
        "timer_lag_max_ms": 1000 * srv.driver.lag_max if srv.driver is not None else 0.0,
        "timer_lag_mean_ms": 1000 * srv.driver.lag_sum / max(1, srv.driver.ticks) if srv.driver is not None else 0.0,
        # the latency profile, so an oracle can predict TTFT
        "itl": e.cfg.itl, "prefill_overhead": e.cfg.prefill_overhead,
        "prefill_per_token": e.cfg.prefill_per_token, "load_factor": e.cfg.load_factor,
        "latency_factor": srv.fleet.latency_factor(srv.index), "time_scale": srv.fleet.time_scale,
        "engine_type": srv.fleet.engine_type, "metrics_time": srv.fleet.metrics_time,
    }


def _orjson(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def probe_one(srv: SimServer, body: dict[str, Any], tokens: list[int], mm: tuple[tk.MMItem, ...] = ()) -> dict[str, Any]:
    model = body.get("model")
    lora = model if isinstance(model, str) and model != srv.model and model in srv.loras else None
    out = engine_state(srv)
    out["url"] = f"http://{srv.host}:{srv.port}"
    out["cached_tokens"] = srv.engine.probe(tokens, lora, mm)
    out["prompt_tokens"] = len(tokens)
    return out


async def request_records(srv: SimServer, request: web.Request) -> web.Response:
    """GET /admin/requests[?since=N]: the server's records after record N (modelsim.records)."""
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        return web.json_response({"error": "since must be an integer (a record's seq)"}, status=400)
    log = srv.requests
    return _orjson({"pod": srv.pod, "time_scale": srv.fleet.time_scale, "last": log.seq, "records": log.since(since)})


def add_admin_routes(app: web.Application, srv: SimServer) -> None:
    async def _parse(request: web.Request) -> tuple[dict[str, Any], list[int], tuple[tk.MMItem, ...]]:
        api = request.query.get("api", tk.API_CHAT)
        body = orjson.loads(await request.read())
        return body, *srv.request_inputs(api, body)

    async def probe(request: web.Request) -> web.Response:
        try:
            body, tokens, mm = await _parse(request)
        except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
            return web.json_response({"error": f"cannot tokenize the probe body: {exc}"}, status=400)
        return _orjson(probe_one(srv, body, tokens, mm))

    async def fleet_probe(request: web.Request) -> web.Response:
        try:
            body, tokens, mm = await _parse(request)
        except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
            return web.json_response({"error": f"cannot tokenize the probe body: {exc}"}, status=400)
        return _orjson({"servers": [probe_one(p, body, tokens, mm) for p in srv.peers if not p.dead]})

    async def kill(request: web.Request) -> web.Response:
        seconds = request.query.get("seconds")

        async def later() -> None:
            await asyncio.sleep(0.05)  # let this reply go out first
            await srv.kill()
            if seconds is not None:
                await asyncio.sleep(float(seconds))
                await srv.listen()

        task = asyncio.get_running_loop().create_task(later())
        srv.background.add(task)
        task.add_done_callback(srv.background.discard)
        return web.json_response({"killed": srv.pod, "revive_after_s": seconds})

    faults = add_fault_routes(app)

    async def state_with_faults(request: web.Request) -> web.Response:
        return _orjson({**engine_state(srv), "faults": faults.describe()})

    async def hang(request: web.Request) -> web.Response:
        what = request.query.get("what", "all")
        if what == "metrics":
            faults.metrics_hung = True
        elif what == "all":
            srv.unhung.clear()
        else:
            return web.json_response({"error": f"what must be all or metrics, got {what!r}"}, status=400)
        return web.json_response({"hung": srv.pod, "what": what})

    async def recover(request: web.Request) -> web.Response:
        srv.unhung.set()
        faults.clear()
        return web.json_response({"recovered": srv.pod})

    app.router.add_get("/admin/state", state_with_faults)
    app.router.add_get("/admin/requests", functools.partial(request_records, srv))
    app.router.add_post("/admin/probe", probe)
    app.router.add_post("/admin/fleet/probe", fleet_probe)
    app.router.add_post("/admin/kill", kill)
    app.router.add_post("/admin/hang", hang)
    app.router.add_post("/admin/recover", recover)

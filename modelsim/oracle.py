"""An in-process oracle router over the fleet's true engine state (a benchmark aid).

`predicted_cost` is pure and shared with bench/routing/oracle.py (the HTTP-proxy variant). The
`OracleRouter` app (`modelsim --oracle-port P`) reads every engine directly, picks the server with the
lowest cost, then hands the very same aiohttp request to that server's handler: no proxy hop, no
staleness (the pick and the engine submit happen without an await in between).

    r       = running (+ requests routed there whose headers are not back yet, proxy variant only)
    load    = min(F, 1 + (F − 1) · r / (max_num_seqs − 1))                 (r + 1 running after admission)
    prefill = overhead + (prompt − cached) · per_token
    queue   = max(0, r + waiting + 1 − max_num_seqs) · (prefill + max_tokens · itl · F) / max_num_seqs
    evict   = max(0, new blocks − never-used blocks) · block_size · per_token / 2
    decode  = max_tokens · itl · load
    cost    = queue + prefill · load + decode + evict + 1e-6 · r               (ties: less loaded)

That is the request's own predicted latency (queue, TTFT and decode at the load it joins), plus `evict`,
a charge for the cached prefixes it would push out (half of their recompute cost).

With a TTFT SLO (header `x-llm-d-slo-ttft-ms`, or the older `x-slo-ttft-ms`; wall milliseconds, converted to model
time with the fleet's time scale) the in-process oracle keeps the servers whose predicted TTFT
(`queue + prefill · load`) meets it and picks the cheapest of them; when none does, the one with the least
predicted TTFT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from modelsim import api as A

if TYPE_CHECKING:
    from modelsim.server import SimServer


SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")


def _terms(st: dict[str, Any], pending: int, max_tokens: int) -> tuple[float, float, float, int]:
    """(load, prefill, queue, uncached tokens) of a request on the server `st` describes."""
    m = max(1, st["max_num_seqs"])
    r = st["running"] + pending
    f = st["load_factor"]
    load = min(f, 1.0 + (f - 1.0) * r / max(1, m - 1))
    uncached = st["prompt_tokens"] - st["cached_tokens"]
    prefill = st["prefill_overhead"] + uncached * st["prefill_per_token"]
    excess = max(0, r + st["waiting"] + 1 - m)
    queue = excess * (prefill + max_tokens * st["itl"] * f) / m
    return load, prefill, queue, uncached


def predicted_ttft(st: dict[str, Any], pending: int, max_tokens: int) -> float:
    """The request's predicted time to first token on the server `st` describes (model seconds)."""
    load, prefill, queue, _ = _terms(st, pending, max_tokens)
    return queue + prefill * load


def slo_seconds(headers: Any, time_scale: float) -> float | None:
    """The request's TTFT SLO in model seconds, from the first SLO header holding a positive number."""
    for name in SLO_TTFT_HEADERS:
        raw = headers.get(name)
        if raw:
            try:
                ms = float(raw)
            except ValueError:
                continue
            if ms > 0 and ms == ms:
                return ms / 1000.0 / time_scale
    return None


def predicted_cost(st: dict[str, Any], pending: int, max_tokens: int) -> float:
    """Cost of sending a request to a server described by an /admin/probe-style dict."""
    r = st["running"] + pending
    load, prefill, queue, uncached = _terms(st, pending, max_tokens)
    bs = st["block_size"]
    new_blocks = -(-(uncached + max_tokens) // bs)
    evict = max(0, new_blocks - st["fresh_blocks"]) * bs * st["prefill_per_token"] / 2
    decode = max_tokens * st["itl"] * load
    return queue + prefill * load + decode + evict + 1e-6 * r


def _state(srv: SimServer, tokens: list[int], lora: str | None, mm: tuple[Any, ...] = ()) -> dict[str, Any]:
    e = srv.engine
    return {"max_num_seqs": e.cfg.max_num_seqs, "running": len(e.running), "waiting": len(e.waiting),
            "load_factor": e.cfg.load_factor, "prompt_tokens": len(tokens), "cached_tokens": e.probe(tokens, lora, mm),
            "prefill_overhead": e.cfg.prefill_overhead, "prefill_per_token": e.cfg.prefill_per_token,
            "itl": e.cfg.itl, "block_size": e.cfg.block_size, "fresh_blocks": e.kv.fresh}


class OracleRouter:
    def __init__(self, servers: list[SimServer]) -> None:
        self.servers = servers
        self.picks = [0] * len(servers)

    def choose(self, api: str, body: dict[str, Any], slo: float | None = None) -> SimServer:
        """The cheapest live server; with a TTFT SLO (model seconds), the cheapest predicted to meet it, else the
        one with the least predicted TTFT."""
        live = [s for s in self.servers if not s.dead and s.unhung.is_set()] or self.servers
        tokens, mm = live[0].request_inputs(api, body)
        model = body.get("model")
        mt = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
        max_tokens = mt if isinstance(mt, int) and mt > 0 else live[0].fleet.engine.default_max_tokens
        scored = []
        for s in live:
            lora = model if isinstance(model, str) and model in s.loras else None
            st = _state(s, tokens, lora, mm)
            scored.append((predicted_cost(st, 0, max_tokens), predicted_ttft(st, 0, max_tokens), s))
        if slo is not None:
            meeting = [x for x in scored if x[1] <= slo]
            if not meeting:
                return min(scored, key=lambda x: x[1])[2]
            scored = meeting
        return min(scored, key=lambda x: x[0])[2]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        api = A.PATH_API[request.path]
        raw = await request.read()  # cached by aiohttp: the chosen server's handler reads it again
        try:
            body = orjson.loads(raw)
            slo = slo_seconds(request.headers, self.servers[0].fleet.time_scale)
            srv = self.choose(api, body, slo) if isinstance(body, dict) else self.servers[0]
        except (orjson.JSONDecodeError, ValueError):
            srv = self.servers[0]
        self.picks[self.servers.index(srv)] += 1
        return await srv.generate(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in A.PATH_API:
            app.router.add_post(path, self.handle)

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def stats(request: web.Request) -> web.Response:
            return web.json_response({"picks": {s.pod: n for s, n in zip(self.servers, self.picks, strict=True)}})

        app.router.add_get("/health", health)
        app.router.add_get("/oracle/stats", stats)
        return app

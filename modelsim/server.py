"""The HTTP face of one simulated vLLM server (aiohttp)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from modelsim import api as A
from modelsim import tokenizer as tk
from modelsim.admin import add_admin_routes
from modelsim.config import FleetConfig
from modelsim.driver import EngineDriver
from modelsim.engine import Engine, EngineError, SimRequest
from modelsim.kvevents import KVEventPublisher, topic_for
from modelsim.metrics import Metrics, ServerMetrics, SglangMetrics
from modelsim.records import RequestLog
from modelsim.streaming import run_generation

_FAILURE_STATUSES = (429, 500, 503)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json",
                        headers=headers)


class SimServer:
    """One simulated server: engine + driver + metrics + optional KV-event publisher + aiohttp app."""

    def __init__(self, fleet: FleetConfig, index: int) -> None:
        self.fleet = fleet
        self.index = index
        self.host = fleet.host
        self.port = fleet.port(index)
        self.pod = f"modelsim-{index}"
        self.role = fleet.role(index)
        self.model = fleet.model
        self.loras: dict[str, str] = {name: name for name in fleet.loras}
        self.lora_ids: dict[str, int] = {}  # vLLM's adapter ids: 1, 2, ... in load order
        for name in fleet.loras:
            self._lora_id(name)
        self.engine_config = fleet.engine_for(index)  # the fleet's engine, scaled by this server's latency factor
        self.engine = Engine(self.engine_config)
        self.hf = None
        if fleet.tokenizer:
            from modelsim.hftok import HFTokenizer

            self.hf = HFTokenizer(fleet.tokenizer)
        self.metrics: Metrics = (
            SglangMetrics(self.engine, self.model, fleet.metrics_scale) if fleet.engine_type == "sglang"
            else ServerMetrics(self.engine, self.model, fleet.engine.max_loras, fleet.metrics_scale))
        self.requests = RequestLog(fleet.request_log_size)
        self.engine.observers += [self.metrics, self.requests]
        self.rng = random.Random(fleet.seed * 1000 + index)
        self.publisher: KVEventPublisher | None = None
        self.driver: EngineDriver | None = None
        self.unhung = asyncio.Event()
        self.unhung.set()
        self.dead = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.background: set[asyncio.Task[Any]] = set()  # admin follow-ups (kill/revive)
        self.peers: list[SimServer] = [self]  # every server of this process (set by Fleet)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        pub = self.fleet.kv_events_port_of(self.index)
        if pub is not None:
            ep = f"tcp://{self.host}:{pub}"
            rp = self.fleet.kv_events_replay_port_of(self.index)
            replay = f"tcp://{self.host}:{rp}" if rp is not None else None
            f = self.fleet
            self.publisher = KVEventPublisher(ep, topic_for(self.host, self.port, self.model), f.engine.block_size,
                                              replay, f.kv_events_buffer_steps, encoding=f.kv_events_encoding,
                                              style=f.kv_events_style, hash_format=f.kv_events_hash_format,
                                              lora_id=self._lora_id)
        self.driver = EngineDriver(self.engine, self.fleet.time_scale, on_advance=self._publish)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._middleware])
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/messages", self.generate)
        app.router.add_post("/v1/responses", self.generate)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_post("/v1/load_lora_adapter", self.load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_lora)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        if self.fleet.engine_type == "sglang":
            app.router.add_post("/flush_cache", self.flush_cache)
        add_admin_routes(app, self)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await self.listen()

    async def listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await self._site.start()
        self.dead = False

    async def kill(self) -> None:
        """Stop listening and drop every in-flight request (the process stays up)."""
        self.dead = True
        if self._site is not None:
            await self._site.stop()
            self._site = None
        for t in list(self._tasks):
            t.cancel()
        if self._runner is not None and self._runner.server is not None:
            for conn in self._runner.server.connections:
                conn.force_close()

    async def stop(self) -> None:
        for t in list(self.background):
            t.cancel()
        if self.driver is not None:
            self.driver.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.publisher is not None:
            self.publisher.close()

    def request_tokens(self, api: str, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids, with the real tokenizer when one is configured (raises ValueError)."""
        return self.request_inputs(api, body)[0]

    def request_inputs(self, api: str, body: dict[str, Any]) -> tuple[list[int], tuple[tk.MMItem, ...]]:
        """The prompt's token ids and media items (modelsim.tokenizer; a real tokenizer sees no media)."""
        if self.hf is not None:
            return self.hf.request_tokens(api, body), ()
        return tk.request_inputs(api, body)

    def _lora_id(self, name: str) -> int:
        lid = self.lora_ids.get(name)
        if lid is None:
            lid = self.lora_ids[name] = len(self.lora_ids) + 1
        return lid

    def _publish(self) -> None:
        raw = self.engine.kv.drain_events()
        if self.publisher is not None and raw:
            self.publisher.publish(raw)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/admin/"):
            if not self.unhung.is_set():
                await self.unhung.wait()
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            resp = await handler(request)
        finally:
            if task is not None:
                self._tasks.discard(task)
        if isinstance(resp, web.Response) and not resp.prepared:
            resp.headers["x-inference-pod"] = self.pod
            resp.headers["x-inference-port"] = str(self.port)
        return resp

    def reply_headers(self) -> dict[str, str]:
        return {"x-inference-pod": self.pod, "x-inference-port": str(self.port)}

    # ---- simple endpoints ------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    def served_models(self) -> list[str]:
        return [self.model, *self.loras]

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        data = [{"id": self.model, "object": "model", "created": now, "owned_by": "modelsim", "root": self.model,
                 "parent": None, "max_model_len": self.fleet.engine.max_model_len}]
        for name, path in self.loras.items():
            data.append({"id": name, "object": "model", "created": now, "owned_by": "modelsim", "root": path,
                         "parent": self.model})
        return _json({"object": "list", "data": data})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        now = self.driver.now() if self.driver is not None else 0.0
        return web.Response(body=self.metrics.render(now), content_type="text/plain", charset="utf-8")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: ``{"prompt"}`` or ``{"messages"}`` (the chat template applied: here the messages'
        canonical JSON) → ``{"count", "max_model_len", "tokens", "token_strs"}``. The ids are exactly those the
        engine caches (and publishes in BlockStored) for the same prompt."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        if model is not None and model not in self.served_models():
            return self._error(404, f"The model `{model}` does not exist.")
        if "messages" in body:
            if not isinstance(body["messages"], list):
                return self._error(400, "'messages' must be a list")
            if body.get("add_generation_prompt", True) and body.get("continue_final_message"):
                return self._error(400, "Cannot set both `continue_final_message` and `add_generation_prompt` "
                                        "to True.")
        elif not isinstance(body.get("prompt"), str):
            return self._error(400, "either 'prompt' (a string) or 'messages' (a list) is required")
        try:
            if self.hf is not None:
                tokens = self.hf.tokenize_endpoint(body)
            elif "messages" in body:
                tokens = tk.request_tokens(tk.API_CHAT, body)
            else:
                tokens = tk.request_tokens(tk.API_COMPLETIONS, {"prompt": body["prompt"]})
        except ValueError as exc:
            return self._error(400, str(exc))
        decode = self.hf.decode if self.hf is not None else tk.decode
        strs = [decode([t]) for t in tokens] if body.get("return_token_strs") else None
        return _json({"count": len(tokens), "max_model_len": self.fleet.engine.max_model_len, "tokens": tokens,
                      "token_strs": strs})

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return self._error(400, "'lora_name' is required")
        if name in self.loras:
            return self._error(400, f"The lora adapter '{name}' has already been loaded.")
        self.loras[name] = str(body.get("lora_path") or name)
        self._lora_id(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        name = body.get("lora_name")
        if name not in self.loras:
            return self._error(404, f"The lora adapter '{name}' cannot be found.")
        del self.loras[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev endpoint: 200 and AllBlocksCleared on success; 409 while running requests hold blocks,
        unless ``?reset_running_requests=true`` (they are preempted and recomputed)."""
        force = request.query.get("reset_running_requests", "false").lower() in ("1", "true", "yes")
        assert self.driver is not None
        ok = self.engine.reset_prefix_cache(self.driver.now(), force)
        self.driver.poke()
        if not ok:
            return self._error(409, "Prefix cache reset failed.")
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's cache flush: only when no request is running or waiting (400 otherwise), like SGLang's."""
        assert self.driver is not None
        e = self.engine
        if e.running or e.waiting or not e.reset_prefix_cache(self.driver.now()):
            return web.Response(status=400, text="Cache not flushed: requests are running or waiting.\n")
        self.driver.poke()
        return web.Response(text="Cache flushed.\n")

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if (err := self._injected_error(request, tk.API_EMBEDDINGS)) is not None:
            return err
        inputs = body.get("input", "")
        items = inputs if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else [inputs]
        data, total = [], 0
        for i, item in enumerate(items):
            try:
                toks = self.request_tokens(tk.API_EMBEDDINGS, {"input": item})
            except ValueError as exc:
                return self._error(400, str(exc), tk.API_EMBEDDINGS)
            total += len(toks)
            vec = [((t * 2654435761 + k) % 2001) / 1000.0 - 1.0 for k, t in enumerate((toks + [0] * 8)[:8])]
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return _json({"object": "list", "data": data, "model": body.get("model", self.model),
                      "usage": {"prompt_tokens": total, "total_tokens": total}})

    # ---- helpers ---------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> Any:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return self._error(400, f"the request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return self._error(400, "the request body must be a JSON object")
        return body

    def _error(self, status: int, message: str, api: str = tk.API_CHAT) -> web.Response:
        return _json(A.error_body(status, message, api), status=status, headers=self.reply_headers())

    def _injected_error(self, request: web.Request, api: str) -> web.Response | None:
        forced = request.headers.get("X-Return-Error")
        if forced:
            try:
                status = int(forced)
            except ValueError:
                return self._error(400, f"X-Return-Error must be an HTTP status code, got {forced!r}", api)
            return self._error(status, f"injected error {status} (X-Return-Error header)", api)
        rate = self.fleet.failure_rate
        if rate > 0 and self.rng.random() < rate:
            status = self.rng.choice(_FAILURE_STATUSES)
            return self._error(status, f"injected failure {status} (failure rate {rate})", api)
        return None

    # ---- generation ------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        api = A.PATH_API[request.path]
        if (err := self._injected_error(request, api)) is not None:
            return err
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        mm: tuple[tk.MMItem, ...] = ()

        def tokenize(a: str, b: dict[str, Any]) -> list[int]:
            nonlocal mm
            tokens, mm = self.request_inputs(a, b)
            return tokens

        try:
            p = A.parse_request(api, body, self.engine_config.default_max_tokens, tokenize)
        except (A.BadRequest, ValueError) as exc:
            return self._error(400, str(exc), api)
        if p.model not in self.served_models():
            return self._error(404, f"The model `{p.model}` does not exist.", api)
        if request.headers.get("x-prefiller-host-port") and not p.remote_decode:
            p.remote_prefill = True  # llm-d P/D sidecar header: the prefill ran elsewhere, TTFT = KV transfer
        lora = p.model if p.model != self.model else None
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        sim = SimRequest(rid, p.tokens, p.output_tokens, lora=lora, mm=mm, remote_decode=p.remote_decode,
                         remote_prefill=p.remote_prefill, finish_reason=p.finish_reason)
        assert self.driver is not None
        try:
            seq, queue = self.driver.submit(sim)
        except EngineError as exc:
            return self._error(exc.status, str(exc), api)
        try:
            return await run_generation(self, request, p, rid, seq, queue)
        except (asyncio.CancelledError, ConnectionResetError):
            with contextlib.suppress(Exception):
                self.driver.cancel(seq)
            raise

    def transfer_params(self, p: A.ParsedRequest, n_blocks: int) -> dict[str, Any] | None:
        if not p.remote_decode:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": list(range(n_blocks)), "remote_engine_id": self.pod,
                "remote_host": self.host, "remote_port": self.port, "tp_size": 1}

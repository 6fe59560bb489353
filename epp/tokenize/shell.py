"""The director's tokenization step: a request is tokenized before scheduling when, and only when, the config
deciding for it reads token ids (it has a `token-producer` for the `token-ids` data; scheduling.prefix.precise_data).

`RequestTokens.prepare(ctx, scheduler)` sets `ctx.request.token_ids` / `token_source` and returns None when that
can be done at once (the prompt's own ids, a loaded local tokenizer, the engine tokenizer's cache, the
approximation), or an awaitable that finishes it (a local tokenizer to load in a worker thread, the engine's
/tokenize to call: the decision then becomes an awaitable, which the ext_proc server awaits while still reading the
stream). It never raises: every failure falls through to the next source, down to the approximation. The engine
asked is the token-producer's `vllm.http` if set, else an endpoint serving the request's model (rotating).

Command line (epp/tokenize/settings.py): --tokenizers-dir (one directory per model: `<dir>/<model name>/tokenizer.json`
+ `tokenizer_config.json`), --tokenize-engine (ask the engine's /tokenize, default true), --tokenize-timeout
(0.5 s), --tokenize-cache (entries of the engine tokenizer's LRU, 4096).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from epp.tokenize.engine import EngineTokenizer
from epp.tokenize.local import TokenizerRegistry
from epp.tokenize.request import TokenizeInput, tokenize_input
from epp.tokenize.settings import TokenizeSettings
from epp.tokenize.tokenizer import RequestTokenizer, TokenizeResult
from scheduling.api import SchedulingContext
from scheduling.prefix.precise_data import TOKEN_IDS
from scheduling.types import Endpoint, LLMRequest

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


def _serves(e: Endpoint, model: str, base: str | None) -> bool:
    return not e.models or model in e.models or (base is not None and base in e.models)


class RequestTokens:
    def __init__(self, tokenizer: RequestTokenizer, scheme: str = "http") -> None:
        self.tokenizer = tokenizer
        self.scheme = scheme
        self._turn = itertools.count()

    @staticmethod
    def producer(scheduler: object, request: LLMRequest) -> Any:
        """The deciding config's token producer, or None when it reads no tokens."""
        find = getattr(scheduler, "producer", None)
        return find(request, TOKEN_IDS) if find is not None else None

    def _urls(self, ctx: SchedulingContext, producer: object) -> list[str]:
        fixed = getattr(producer, "engine_url", None)
        if fixed:
            return [fixed]
        req = ctx.request
        model = req.target_model or req.model
        eps = [e for e in ctx.candidates if _serves(e, model, req.base_model)]
        if len(eps) > 1:
            k = next(self._turn) % len(eps)
            eps = eps[k:] + eps[:k]
        return [f"{self.scheme}://{e.key}" for e in eps]

    def input_for(self, req: LLMRequest, producer: object) -> TokenizeInput:
        model = req.target_model or req.model
        inp = tokenize_input(req.kind, req.body or {}, model, req.base_model, req.prompt)
        name = getattr(producer, "model_name", None)
        return dataclasses.replace(inp, model=name) if name else inp

    def prepare(self, ctx: SchedulingContext, scheduler: object, *, dry_run: bool = False,
                wait: bool = True) -> Awaitable[TokenizeResult] | None:
        """Tokenize `ctx.request` if the deciding config reads tokens: None when done (or not needed), else an
        awaitable that finishes it. `dry_run` (explain) counts nothing; `wait` False never returns an awaitable
        (the sources that would need one are passed over)."""
        req = ctx.request
        producer = self.producer(scheduler, req)
        if producer is None:
            return None
        model = req.target_model or req.model
        if not any(_serves(e, model, req.base_model) for e in ctx.candidates):
            return None  # an external provider, or nobody serves the model (scheduling says so): nothing to do
        inp = self.input_for(req, producer)
        urls = self._urls(ctx, producer)
        got = self.tokenizer.try_now(inp, urls, record=not dry_run, wait=wait)
        if got is not None:
            self._set(req, got)
            return None
        return self._finish(req, inp, urls, getattr(producer, "timeout", None), not dry_run)

    async def _finish(self, req: LLMRequest, inp: TokenizeInput, urls: Sequence[str],
                      timeout: float | None, record: bool) -> TokenizeResult:
        got = await self.tokenizer.tokenize(inp, urls, timeout, record)
        self._set(req, got)
        return got

    def _set(self, req: LLMRequest, got: TokenizeResult) -> None:
        req.token_ids = got.tokens
        req.token_source = got.source


def tokens_from_settings(settings: TokenizeSettings, registry: CollectorRegistry | None = None) -> RequestTokens:
    """The director's tokenization step from its settings."""
    local = TokenizerRegistry(root=settings.tokenizers_dir) if settings.tokenizers_dir else None
    engine = None
    if settings.engine:
        engine = EngineTokenizer(timeout=settings.timeout, cache_entries=settings.cache_entries)
    return RequestTokens(RequestTokenizer(local, engine, registry=registry))

"""`RequestTokenizer`: the tokenization sources tried in order (epp/tokenize/__init__.py says which and why)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epp.tokenize.engine import EngineTokenizer
from epp.tokenize.local import LocalTokenizer, TokenizerRegistry
from epp.tokenize.request import TokenizeInput

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

SOURCES = ("prompt", "local", "engine", "approx")


def approx_tokens(text: str) -> list[int]:
    """The character approximation: each 4 bytes of UTF-8 are one token (the last chunk NUL-padded)."""
    data = text.encode("utf-8")
    rem = len(data) % 4
    if rem:
        data += b"\0" * (4 - rem)
    return list(struct.unpack(f">{len(data) // 4}I", data))


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    tokens: list[int]
    source: str  # one of SOURCES
    detail: str = ""


class RequestTokenizer:
    def __init__(self, local: TokenizerRegistry | None = None, engine: EngineTokenizer | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.local = local
        self.engine = engine
        self.counts = dict.fromkeys(SOURCES, 0)
        self._counter = None
        if registry is not None:
            from prometheus_client import Counter

            self._counter = Counter("pointsman_tokenize_requests_total", "Requests tokenized, by source.",
                                    ["source"], registry=registry)

    def _done(self, tokens: Sequence[int], source: str, detail: str, record: bool = True) -> TokenizeResult:
        if record:
            self.counts[source] += 1
            if self._counter is not None:
                self._counter.labels(source).inc()
        return TokenizeResult(list(tokens), source, detail)

    def _local(self, tok: LocalTokenizer | None, req: TokenizeInput) -> tuple[list[int] | None, str]:
        if tok is None:
            return None, f"no local tokenizer for {req.model}"
        try:
            if req.messages is not None:
                return tok.encode_chat(req.messages, req.add_generation_prompt, req.tools,
                                       req.continue_final_message), ""
            if req.prompt is not None:
                return tok.encode_prompt(req.prompt), ""
        except ValueError as e:
            return None, f"local: {e}"
        return None, "local: nothing to tokenize"

    @staticmethod
    def _engine_kw(req: TokenizeInput) -> dict[str, Any]:
        return {"prompt": req.prompt if req.messages is None else None, "messages": req.messages,
                "add_generation_prompt": req.add_generation_prompt,
                "continue_final_message": req.continue_final_message, "tools": req.tools}

    async def tokenize(self, req: TokenizeInput, engine_urls: Sequence[str] = (),
                       timeout: float | None = None, record: bool = True) -> TokenizeResult:
        """Tokens for `req`; `engine_urls` are base URLs of endpoints serving the model (tried in order);
        `timeout` overrides the engine tokenizer's own for this call; `record` False counts nothing (explain)."""
        if req.prompt_ids is not None:
            return self._done(req.prompt_ids, "prompt", "", record)
        notes = []
        if self.local is not None:
            tokens, why = self._local(await self.local.aget(req.model), req)
            if tokens is not None:
                return self._done(tokens, "local", "", record)
            notes.append(why)
        if self.engine is not None and (req.messages is not None or req.prompt is not None):
            kw = self._engine_kw(req)
            tokens = self.engine.lookup(req.request_model, **kw)
            if tokens is not None:
                self.engine.hits += 1
                return self._done(tokens, "engine", "; ".join(notes), record)
            url = next((u for u in engine_urls if self.engine.usable(u)), None)
            if url is not None:  # one call per request at most: a failing engine is backed off
                tokens = await self.engine.tokenize(url, req.request_model, timeout=timeout, **kw)
                if tokens is not None:
                    return self._done(tokens, "engine", "; ".join(notes), record)
                notes.append(f"engine: {url} failed")
            else:
                notes.append("engine: no usable endpoint")
        return self._done(approx_tokens(req.approx_text), "approx", "; ".join(notes), record)

    def try_now(self, req: TokenizeInput, engine_urls: Sequence[str] = (), record: bool = True,
                wait: bool = True) -> TokenizeResult | None:
        """The result `tokenize` would give, when it can be had without waiting (the prompt's own ids, a loaded
        local tokenizer, the engine tokenizer's cache, or the approximation when no engine call is possible);
        None when only `await tokenize(...)` can tell (a local tokenizer to load, an engine call to make).
        With `wait` False it never returns None: those sources are passed over."""
        if req.prompt_ids is not None:
            return self._done(req.prompt_ids, "prompt", "", record)
        notes = []
        if self.local is not None:
            known, tok = self.local.lookup_nowait(req.model)
            if not known and wait:
                return None  # a local tokenizer exists but is not loaded yet
            tokens, why = self._local(tok, req) if known else (None, "local: not loaded yet")
            if tokens is not None:
                return self._done(tokens, "local", "", record)
            notes.append(why)
        if self.engine is not None and (req.messages is not None or req.prompt is not None):
            tokens = self.engine.lookup(req.request_model, **self._engine_kw(req))
            if tokens is not None:
                self.engine.hits += 1
                return self._done(tokens, "engine", "; ".join(notes), record)
            if wait and any(self.engine.usable(u) for u in engine_urls):
                return None
            notes.append("engine: not asked" if not wait else "engine: no usable endpoint")
        return self._done(approx_tokens(req.approx_text), "approx", "; ".join(notes), record)

    def tokenize_nowait(self, req: TokenizeInput) -> TokenizeResult:
        """Like `tokenize` without the engine and without loading a tokenizer (never awaits)."""
        if req.prompt_ids is not None:
            return self._done(req.prompt_ids, "prompt", "")
        notes = []
        if self.local is not None:
            tokens, why = self._local(self.local.loaded(req.model), req)
            if tokens is not None:
                return self._done(tokens, "local", "")
            notes.append(why)
        return self._done(approx_tokens(req.approx_text), "approx", "; ".join(notes))


__all__ = ["SOURCES", "RequestTokenizer", "TokenizeResult", "approx_tokens"]

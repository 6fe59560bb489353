"""The engine's own tokenizer: vLLM's ``POST /tokenize``, behind a bounded cache, a timeout and a back-off.

Request: ``{"model", "prompt"}`` for a prompt, or ``{"model", "messages", "add_generation_prompt",
"continue_final_message"[, "tools"]}`` for chat (the engine applies its chat template; for chat vLLM adds no
special tokens beyond the template's). Reply: ``{"count", "max_model_len", "tokens": [...]}``.

- **Cache.** Results are kept per (model, request) in an LRU bounded by `cache_entries` and `cache_tokens`
  (tokens are stored as 32-bit arrays). The key is a 128-bit hash of the request body.
- **Timeout.** One call waits at most `timeout` seconds.
- **Back-off.** A failed call (timeout, connection error, non-200, a body without a token list) takes that base
  URL out of use for `backoff` seconds, so a dead engine costs one timeout, not one per request.

Public API: `EngineTokenizer(session=None, timeout=0.5, ...)` with `await tokenize(base_url, model, prompt=...,
messages=...)` → list of ids or None, `usable(base_url, now)`, `errors` (reason → count), `close()`.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
import xxhash


class EngineTokenizer:
    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        *,
        timeout: float = 0.5,
        backoff: float = 5.0,
        cache_entries: int = 4096,
        cache_tokens: int = 4_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._own_session = session is None
        self.timeout = timeout
        self.backoff = backoff
        self.cache_entries = cache_entries
        self.cache_tokens = cache_tokens
        self._clock = clock
        self._cache: OrderedDict[bytes, array[int]] = OrderedDict()
        self._cached_tokens = 0
        self._down_until: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self.hits = 0
        self.misses = 0

    # ---- cache ------------------------------------------------------------------------------------------
    @staticmethod
    def _key(model: str, body: Mapping[str, Any]) -> bytes:
        return xxhash.xxh3_128_digest(model.encode() + b"\0" + orjson.dumps(body, option=orjson.OPT_SORT_KEYS))

    def _get(self, key: bytes) -> list[int] | None:
        v = self._cache.get(key)
        if v is None:
            return None
        self._cache.move_to_end(key)
        return v.tolist()

    def _put(self, key: bytes, tokens: Sequence[int]) -> None:
        if len(tokens) > self.cache_tokens:
            return
        try:
            a = array("I", tokens)
        except OverflowError:
            a = array("Q", tokens)
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_tokens -= len(old)
        self._cache[key] = a
        self._cached_tokens += len(a)
        while len(self._cache) > self.cache_entries or self._cached_tokens > self.cache_tokens:
            _, gone = self._cache.popitem(last=False)
            self._cached_tokens -= len(gone)

    @property
    def cached(self) -> int:
        return len(self._cache)

    # ---- calls ------------------------------------------------------------------------------------------
    def usable(self, base_url: str, now: float | None = None) -> bool:
        until = self._down_until.get(base_url)
        return until is None or (self._clock() if now is None else now) >= until

    def _fail(self, base_url: str, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self._down_until[base_url] = self._clock() + self.backoff

    @staticmethod
    def _body(model: str, prompt: str | None, messages: Sequence[Mapping[str, Any]] | None,
              add_generation_prompt: bool, continue_final_message: bool, tools: Sequence[Any] | None) -> dict[str, Any]:
        if messages is not None:
            body: dict[str, Any] = {"model": model, "messages": list(messages),
                                    "add_generation_prompt": add_generation_prompt and not continue_final_message,
                                    "continue_final_message": continue_final_message}
            if tools:
                body["tools"] = list(tools)
            return body
        if prompt is not None:
            return {"model": model, "prompt": prompt}
        raise ValueError("tokenize needs a prompt or messages")

    def lookup(self, model: str, *, prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               tools: Sequence[Any] | None = None) -> list[int] | None:
        """The cached result for this request, if any (no call)."""
        body = self._body(model, prompt, messages, add_generation_prompt, continue_final_message, tools)
        return self._get(self._key(model, body))

    async def tokenize(self, base_url: str, model: str, *, prompt: str | None = None,
                       messages: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                       continue_final_message: bool = False, tools: Sequence[Any] | None = None,
                       timeout: float | None = None) -> list[int] | None:
        """Token ids from the engine at `base_url` (cached), or None (reason counted in `errors`). `timeout`
        overrides the tokenizer's own for this call."""
        body = self._body(model, prompt, messages, add_generation_prompt, continue_final_message, tools)
        key = self._key(model, body)
        hit = self._get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        if not self.usable(base_url):
            self.errors["backoff"] = self.errors.get("backoff", 0) + 1
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            status, raw = await asyncio.wait_for(self._post(base_url, body),
                                                 self.timeout if timeout is None else timeout)
        except asyncio.TimeoutError:
            self._fail(base_url, "timeout")
            return None
        except aiohttp.ClientError:
            self._fail(base_url, "connection")
            return None
        if status != 200:
            self._fail(base_url, f"http_{status}")
            return None
        try:
            tokens = orjson.loads(raw).get("tokens")
        except (orjson.JSONDecodeError, AttributeError):
            tokens = None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):  # noqa: E721
            self._fail(base_url, "bad_reply")
            return None
        self._put(key, tokens)
        return tokens

    async def _post(self, base_url: str, body: Mapping[str, Any]) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.post(f"{base_url.rstrip('/')}/tokenize", data=orjson.dumps(body),
                                      headers={"content-type": "application/json"}) as r:
            return r.status, await r.read()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

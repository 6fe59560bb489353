"""Session identity: which agent session (and program) a request belongs to, from what the client already sends.

Sources, the first usable one wins:
    route       the route's own session settings: Kthena's `sessionSticky.sources` (header, query, cookie, JWT
                claim), LLMKube's `sessionAffinity.headers` (the shell passes them as `extra`)
    header      the configured headers, in order (default `x-session-id`)
    previous_response_id   the Responses API: the session of the response it continues (`ResponseChains`, learnt
                from response bodies), else a session named by that response id
    body        `metadata.session_id`, `prompt_cache_key` (OpenAI), `user` (OpenAI), `metadata.user_id` (Anthropic)
    responses   a Responses API request with none of the above starts a chain of its own (keyed by its request id),
                so that the response it produces can be continued
A value is used when it is a non-empty string (or an integer) of at most `max_bytes` UTF-8 bytes; anything else
(huge, empty, an object) is skipped and counted, never an error: a session is a routing hint. Lone surrogates (a
header Envoy passed as raw bytes) are hashed as they are. Only an xxh3-128 hash of the value is kept.

The program is what the session runs: the `program_header` when set and present, else the first `program_chars`
characters of the prompt (its system prompt and tools) with the model. Sessions of one program share what is learnt
about their pauses, and flow control can key fairness by program.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from scheduling.plugins.scorers.session_affinity import session_key
from scheduling.types import ApiKind, LLMRequest, SessionRef

BODY_FIELDS = ("metadata.session_id", "prompt_cache_key", "user", "metadata.user_id")
RESPONSE_CHAINS = 65_536  # response ids remembered (LRU)


@dataclass(frozen=True)
class IdentitySources:
    headers: tuple[str, ...] = ("x-session-id",)  # lower-case header names, in order
    body: tuple[str, ...] = BODY_FIELDS  # body fields, in order ("a.b": field b of object a)
    previous_response_id: bool = True
    responses_chain: bool = True  # a Responses request without any identity starts its own chain
    program_header: str = ""  # lower-case; "" derives the program from the prompt's head
    program_chars: int = 2048
    max_bytes: int = 256


def _encode(value: object, limit: int) -> bytes | None:
    """The value's bytes when it is usable as a session value, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > limit:  # chars <= bytes: a cheap first bound
        return None
    raw = value.encode("utf-8", "surrogatepass")
    return raw if len(raw) <= limit else None


def _field(body: Mapping[str, Any], path: str) -> object:
    head, _, rest = path.partition(".")
    v = body.get(head)
    if rest:
        return v.get(rest) if isinstance(v, Mapping) else None
    return v


class ResponseChains:
    """Response id -> the session it belongs to (LRU, bounded): a Responses API request that continues a response
    (`previous_response_id`) joins that response's session."""

    def __init__(self, capacity: int = RESPONSE_CHAINS) -> None:
        self.capacity = capacity
        self._chains: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chains)

    @staticmethod
    def response_key(response_id: bytes) -> int:
        return xxhash.xxh3_128_intdigest(b"resp\0" + response_id)

    def get(self, response_key: int) -> int | None:
        return self._chains.get(response_key)

    def learn(self, response_id: str, session_key: int, limit: int = 256) -> bool:
        raw = _encode(response_id, limit)
        if raw is None:
            return False
        k = self.response_key(raw)
        chains = self._chains
        chains[k] = session_key
        chains.move_to_end(k)
        while len(chains) > self.capacity:
            chains.popitem(last=False)
        return True


def named_by(headers: Mapping[str, str], body: Mapping[str, Any], src: IdentitySources) -> bool:
    """Whether the headers or the body members given hold a value for one of the session sources (usable or not):
    asked of the members that have arrived, it says whether one still to come could name the session."""
    if any(headers.get(name) for name in src.headers):
        return True
    if src.previous_response_id and body.get("previous_response_id") is not None:
        return True
    return any(_field(body, path) not in (None, "") for path in src.body)


def program_of(req: LLMRequest, headers: Mapping[str, str], src: IdentitySources) -> int:
    if src.program_header:
        raw = _encode(headers.get(src.program_header), src.max_bytes)
        if raw is not None:
            return xxhash.xxh3_64_intdigest(b"program\0" + raw) or 1
    head = req.prompt[: src.program_chars]
    if not head:
        return 0
    return xxhash.xxh3_64_intdigest(f"{req.target_model}\0{head}".encode("utf-8", "surrogatepass")) or 1


def identify(req: LLMRequest, src: IdentitySources, *, extra: Sequence[tuple[str, str]] = (),
             chains: ResponseChains | None = None) -> tuple[SessionRef | None, list[str]]:
    """The request's session (None: it names none) and the sources skipped as unusable (for explain and counters).
    Never raises on client input."""
    headers = req.headers
    skipped: list[str] = []
    limit = src.max_bytes
    raw: bytes | None = None
    source = ""
    if extra:
        value = session_key(headers, extra)
        if value:
            raw = _encode(value, limit)
            if raw is None:
                skipped.append("route")
            else:
                source = "route"
    if raw is None:
        for name in src.headers:
            hv = headers.get(name)
            if hv:
                raw = _encode(hv, limit)
                if raw is not None:
                    source = f"header:{name}"
                    break
                skipped.append(f"header:{name}")
    body = req.body
    key: int | None = None
    if raw is None and body:
        if src.previous_response_id:
            prev = body.get("previous_response_id")
            if prev is not None:
                rid = _encode(prev, limit)
                if rid is None:
                    skipped.append("previous_response_id")
                else:
                    rk = ResponseChains.response_key(rid)
                    known = chains.get(rk) if chains is not None else None
                    key, source = (known if known is not None else rk), "previous_response_id"
        if key is None:
            for path in src.body:
                bv = _field(body, path)
                if bv is None or bv == "":
                    continue
                raw = _encode(bv, limit)
                if raw is not None:
                    source = path
                    break
                skipped.append(path)
    if key is None and raw is not None:
        key = xxhash.xxh3_128_intdigest(raw)
    if key is None and src.responses_chain and req.kind is ApiKind.RESPONSES and body is not None:
        key, source = xxhash.xxh3_128_intdigest(b"chain\0" + req.request_id.encode("utf-8", "surrogatepass")), \
            "responses"
    if key is None:
        return None, skipped
    return SessionRef(key, source, program_of(req, headers, src)), skipped

"""byte-prefix-affinity-scorer (LLMKube's prefixAffinity): the endpoint most likely to hold the prompt's prefix.

The router remembers which prompt blocks it sent to each endpoint; it needs no engine support and no tokenizer.
    bytes    = JSON of `tools` ‖ `system` (Anthropic; a string as is) ‖ JSON of `messages`, compact (chat and
               Anthropic messages); the request's prompt text, UTF-8, for the other APIs
    blocks   = the whole blockBytes-byte blocks of those bytes (1024; a trailing partial block is not a block),
               chained: h_0 = xxh64(block_0, seed = xxh64(target model)), h_i = xxh64(block_i, seed = h_{i−1})
    matched(e) = consecutive blocks from the start that e was sent
    score(e) = matched(e) / blocks;  0 for every endpoint when the prompt has no whole block
pre_request records the blocks for the chosen endpoint: an exact LRU of at most maxBlocksPerEndpoint (16,384)
blocks per endpoint, the least recently sent going first (within one request, its last block first, so a shared
prefix outlives the tails). A departed endpoint is forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint

_KEY = "byte-prefix-affinity.blocks"


@dataclass(frozen=True)
class Params:
    blockBytes: int = bounded(1024, min=1)
    maxBlocksPerEndpoint: int = bounded(16_384, min=1)


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return str(value).encode("utf-8", "replace")


def prompt_bytes(body: Mapping[str, Any] | None, prompt: str) -> bytes:
    """The bytes LLMKube hashes: tools, the system prompt and the messages; the prompt text otherwise."""
    if body is not None and isinstance(body.get("messages"), list):
        parts = []
        if body.get("tools"):
            parts.append(_json(body["tools"]))
        system = body.get("system")
        if system:
            parts.append(system.encode("utf-8", "replace") if isinstance(system, str) else _json(system))
        parts.append(_json(body["messages"]))
        return b"".join(parts)
    return prompt.encode("utf-8", "replace")


def block_chain(data: bytes, block: int, model: str, limit: int) -> list[int]:
    h = xxhash.xxh64_intdigest
    prev = h(model.encode("utf-8", "replace"))
    out = []
    for i in range(min(len(data) // block, limit)):
        prev = h(data[i * block:(i + 1) * block], seed=prev)
        out.append(prev)
    return out


@register("byte-prefix-affinity-scorer")
class BytePrefixAffinityScorer(Scorer[Params]):
    Params = Params
    clamped = True
    whole_prompt = True  # it hashes every block of the prompt: no decision on its head (epp/request/early.py)

    def setup(self, build: BuildContext) -> None:
        self.sent: dict[str, OrderedDict[int, None]] = {}  # endpoint key -> LRU of block hashes

    def blocks(self, ctx: SchedulingContext, state: State) -> list[int]:
        got = state.get(_KEY)
        if got is None:
            req = ctx.request
            p = self.params
            got = state[_KEY] = block_chain(prompt_bytes(req.body, req.prompt), p.blockBytes,
                                            req.target_model or req.model, p.maxBlocksPerEndpoint)
        return list(got)

    def matched(self, key: str, blocks: list[int]) -> int:
        lru = self.sent.get(key)
        if not lru:
            return 0
        n = 0
        for b in blocks:
            if b not in lru:
                break
            n += 1
        return n

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        blocks = self.blocks(ctx, state)
        if not blocks:
            return [0.0] * len(candidates)
        total = len(blocks)
        return [self.matched(e.key, blocks) / total for e in candidates]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        if not result.targets:
            return
        blocks = self.blocks(ctx, state)
        if not blocks:
            return
        key = result.targets[0].key
        lru = self.sent.get(key)
        if lru is None:
            lru = self.sent[key] = OrderedDict()
        for b in reversed(blocks):  # a prompt's first blocks count as sent last: a prefix outlives its tail
            lru[b] = None
            lru.move_to_end(b)
        cap = self.params.maxBlocksPerEndpoint
        while len(lru) > cap:
            lru.popitem(last=False)

    def endpoint_removed(self, key: str) -> None:
        self.sent.pop(key, None)

    def tracked_endpoints(self) -> Collection[str]:
        return set(self.sent)

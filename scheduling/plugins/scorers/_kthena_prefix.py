"""Shared by Kthena's prefix scorers (prefix-cache, kvcache-aware): matched / total blocks on the approximate prefix
index, with Kthena's parameter names; a block of blockSizeToHash units (characters or tokens) must be whole tokens
for the index (a token is estimated as 4 characters).

When the shell has the precise index (the engines' KV events, the service `precise-index`), both map onto it, as
Kthena's own kvcache-aware reads the engines' events: endpoints whose index state is live are scored from the
events (weighted matched blocks / prompt blocks, scheduling.prefix.precise_data), the others from the approximate
index as before; the request is then tokenized (token-producer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, ConfigError, Scorer
from scheduling.framework.data import DataKey, DataRequest
from scheduling.framework.errors import join_path
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix import PrefixReader
from scheduling.prefix.precise_data import (
    PRECISE_INDEX,
    PreciseReader,
    precise_request,
    prefix_hits,
    token_request,
)
from scheduling.prefix.shared import APPROX_PREFIX
from scheduling.types import CHARS_PER_TOKEN, Endpoint


@dataclass(frozen=True)
class CharParams:
    blockSizeToHash: int = bounded(64, min=CHARS_PER_TOKEN)  # characters
    maxBlocksToMatch: int = bounded(128, min=1)
    maxHashCacheSize: int = bounded(50_000, min=1)
    topKMatches: int = bounded(5, min=1)


@dataclass(frozen=True)
class TokenParams:
    blockSizeToHash: int = bounded(16, min=1)  # tokens
    maxBlocksToMatch: int = bounded(128, min=1)
    vllmTokenizerPort: int = bounded(8000, min=1, max=65535)  # accepted: Kthena's remote tokenizer
    sglangTokenizerPort: int = bounded(30000, min=1, max=65535)


class KthenaPrefix(PreciseReader[CharParams], PrefixReader[CharParams], Scorer[CharParams]):
    clamped = True
    produces_prefix = True
    chars_per_unit: ClassVar[int] = 1  # how many characters one unit of blockSizeToHash is

    @property
    def reads_precise(self) -> bool:
        return PRECISE_INDEX in self.services

    def setup(self, build: BuildContext) -> None:
        chars = self.params.blockSizeToHash * self.chars_per_unit
        if chars % CHARS_PER_TOKEN:
            raise ConfigError(build.source, join_path(build.path, "blockSizeToHash"),
                              f"a multiple of {CHARS_PER_TOKEN} characters (the index estimates a token as "
                              f"{CHARS_PER_TOKEN} characters), got {chars}")
        self.block_tokens = chars // CHARS_PER_TOKEN

    def data_requests(self) -> Sequence[DataRequest]:
        params = {"blockSizeTokens": self.block_tokens, "maxPrefixBlocksToMatch": self.params.maxBlocksToMatch}
        approx = DataRequest(DataKey(APPROX_PREFIX, self.block_tokens), params, True)
        if not self.reads_precise:
            return (approx,)
        return (approx, precise_request({}, produces=True), token_request())

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        if self.precise is not None:
            hits = prefix_hits(ctx, state, candidates, self.precise, self.prefix)
            return [hits[e.key].ratio for e in candidates]
        matches, total = self.prefix.matches(ctx, state)
        if not matches or not total:
            return [0.0] * len(candidates)
        get = matches.get
        return [get(e.key, 0) / total for e in candidates]

"""approx-prefix-cache-producer (llm-d): the one writer of the approximate prefix index for one block size.

Hashing (scheduling.prefix.hashing): block = blockSizeTokens (16) × CHARS_PER_TOKEN characters, chained xxhash64
with seed xxh64(model ‖ cache_salt), trailing partial block included, at most maxPrefixBlocksToMatch (256) blocks.

    matches(e)  = consecutive blocks from the start of the prompt that e is believed to hold   (once per decision)
    pre_request: the prompt's blocks are recorded for the chosen endpoint and the P/D prefill endpoint
    capacity(e) = lruCapacityPerServer (31,250) blocks, or with autoTune
                  num_gpu_blocks(e) × block_size(e) / blockSizeTokens when e's metrics report both
    eviction    = CLOCK (second chance) per endpoint, at capacity
    forgetting  = at endpoint_removed (the datastore reports a departed endpoint); as a safety net for shells that do
                  not, endpoints neither candidates nor chosen for forgetAfterSeconds (900; 0 = never) are dropped,
                  checked every 256 recordings

It is declared in a config's plugin list, or created by the loader for the plugins that produce prefix data
(prefix-cache-scorer, estimated-latency-scorer); every prefix-aware plugin with the same blockSizeTokens reads it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Plugin, Producer, register
from scheduling.framework.data import DataKey
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.prefix.cycle import cycle_hashes, cycle_matches
from scheduling.prefix.index import PrefixIndex
from scheduling.prefix.shared import APPROX_PREFIX

_RECORDED = "approx-prefix.recorded"


@dataclass(frozen=True)
class Params:
    blockSizeTokens: int = bounded(16, min=1)
    maxPrefixBlocksToMatch: int = bounded(256, min=1)
    lruCapacityPerServer: int = bounded(31_250, min=1)
    autoTune: bool = True
    forgetAfterSeconds: float = bounded(900.0, min=0.0)


@register("approx-prefix-cache-producer")
class ApproxPrefixProducer(Producer[Params]):
    Params = Params
    defining_params = ("blockSizeTokens", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "autoTune",
                       "forgetAfterSeconds")

    def setup(self, build: BuildContext) -> None:
        p: Params = self.params
        self.block_tokens = p.blockSizeTokens
        self.max_blocks = p.maxPrefixBlocksToMatch
        self.index = PrefixIndex(p.lruCapacityPerServer)
        self._records = 0

    def data_key(self) -> DataKey:
        return DataKey(APPROX_PREFIX, self.block_tokens)

    def matches(self, ctx: SchedulingContext, state: State) -> tuple[dict[str, int], int]:
        return cycle_matches(ctx, state, self.index, self.block_tokens, self.max_blocks)

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        """Record the prompt's blocks for the chosen endpoint (and the prefill endpoint), once per decision."""
        if state.get(_RECORDED) is self:
            return
        state[_RECORDED] = self
        p: Params = self.params
        chosen = [e for e in (result.targets[0] if result.targets else None, result.prefill) if e is not None]
        index = self.index
        if p.forgetAfterSeconds > 0:
            self._records += 1
            if not self._records & 255:
                index.seen((e.key for e in ctx.candidates), ctx.now)
                index.forget_idle(ctx.now, p.forgetAfterSeconds)
        hashes = cycle_hashes(ctx, state, self.block_tokens, self.max_blocks)
        if not hashes:
            return
        for ep in chosen:
            if p.autoTune:
                m = ep.metrics
                if m.num_gpu_blocks and m.block_size:
                    cap = max(1, m.num_gpu_blocks * m.block_size // self.block_tokens)
                    if cap != index.capacity(ep.key):
                        index.set_capacity(ep.key, cap)
            index.record(ep.key, hashes, ctx.now)

    def endpoint_removed(self, key: str) -> None:
        self.index.forget(key)

    def tracked_endpoints(self) -> Collection[str]:
        return self.index.endpoints()


def create_approx_prefix(key: DataKey, params: Mapping[str, object], requesters: list[Plugin[Any]]) -> Producer[Any]:
    """The loader's factory: a producer with the parameters the requesting plugins set (defaults otherwise)."""
    first = requesters[0]
    build = BuildContext(source=first.source, path=first.path, given=frozenset(params))
    values = dict(params)
    values["blockSizeTokens"] = key.variant
    return ApproxPrefixProducer(f"approx-prefix-cache-producer[{key.variant}]", Params(**values), build)  # type: ignore[arg-type]

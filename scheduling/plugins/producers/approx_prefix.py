"""approx-prefix-cache-producer (llm-d): the one writer of the approximate prefix index for one block size.

Hashing (scheduling.prefix.hashing): block = blockSizeTokens (16) × CHARS_PER_TOKEN characters, chained xxh3-64
(each block seeded with the previous block's hash, the first with xxh3(model ‖ 0 ‖ cache_salt)), trailing partial
block included, at most maxPrefixBlocksToMatch (256) blocks.

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

Replication (scheduling/framework/replication.py): the blocks of every pick are idempotent records
[endpoint key, [block hash, ...]]; a peer's records are recorded into this index as if this process had made the
pick, so every replica's index holds what every replica sent (what the engines really cache).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Plugin, Producer, register
from scheduling.framework.data import DataKey
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record, drain, is_count
from scheduling.prefix.cycle import cycle_hashes, cycle_matches
from scheduling.prefix.index import PrefixIndex
from scheduling.prefix.shared import APPROX_PREFIX

_RECORDED = "approx-prefix.recorded"
MAX_OUTBOX = 4096  # records kept for the bus between two exports; the oldest go first if it stalls
RECENT = 1024  # picks kept (as packed hashes) for peers that join


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
        self._outbox: deque[Record] | None = None  # set while replicating
        self._recent: deque[tuple[str, array[int]]] = deque(maxlen=RECENT)

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
            if self._outbox is not None:
                self._outbox.append([ep.key, hashes])
                self._recent.append((ep.key, array("Q", hashes)))

    def endpoint_removed(self, key: str) -> None:
        self.index.forget(key)
        if any(k == key for k, _ in self._recent):
            self._recent = deque(((k, h) for k, h in self._recent if k != key), maxlen=RECENT)

    def tracked_endpoints(self) -> Collection[str]:
        return self.index.endpoints()

    # ---- replication -------------------------------------------------------------------------------------
    def replication_key(self) -> str:
        return f"approx-prefix/{self.block_tokens}"

    def set_replicating(self, on: bool) -> None:
        self._outbox = deque(maxlen=MAX_OUTBOX) if on else None
        self._recent.clear()

    def snapshot_records(self, now: float) -> list[Record]:
        """The last RECENT picks (of endpoints still held)."""
        held = set(self.index.endpoints())
        return [[key, hashes.tolist()] for key, hashes in self._recent if key in held]

    def export_records(self, now: float) -> list[Record]:
        return drain(self._outbox)

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        """Record a peer's picks: [endpoint key, [block hash, ...]] (at most maxPrefixBlocksToMatch hashes)."""
        bad = 0
        for rec in records:
            if (len(rec) != 2 or not isinstance(rec[1], list) or len(rec[1]) > self.max_blocks
                    or not all(is_count(h) for h in rec[1])):
                bad += 1
                continue
            if rec[1]:
                self.index.record(rec[0], rec[1], now)
        return bad


def create_approx_prefix(key: DataKey, params: Mapping[str, object], requesters: list[Plugin[Any]]) -> Producer[Any]:
    """The loader's factory: a producer with the parameters the requesting plugins set (defaults otherwise)."""
    first = requesters[0]
    build = BuildContext(source=first.source, path=first.path, given=frozenset(params))
    values: dict[str, Any] = dict(params)  # checked by the requesting plugins' parameter parsing
    values["blockSizeTokens"] = key.variant
    return ApproxPrefixProducer(f"approx-prefix-cache-producer[{key.variant}]", Params(**values), build)

"""The precise prefix index: which endpoint holds which prompt block, from the engines' own KV-cache events.

Pure: no I/O, no clock (every time-dependent call takes `now`). One writer applies the engines' events (the
KV-event subscriber, through `store` / `remove` / `clear` / `mark_unknown`); the scheduler records its own
picks as speculative entries (`add_speculative`) and reads with `match`.

Keys are Pointsman's own (scheduling.prefix.token_keys), computed from BlockStored's token ids at this
index's `block_size`, so the engine's block size and hash seed do not matter. A per-slot map from engine block
hash to key resolves BlockRemoved and links the next BlockStored to its parent.

Slots. Each (endpoint, data-parallel rank) is one slot with a state:
- ``pending``: no event seen yet (just subscribed);
- ``live``: the slot has seen every batch since the engine started, or since its last AllBlocksCleared;
- ``unknown``: batches were lost and could not be replayed. The slot is emptied when it turns unknown; what it
  holds afterwards is true but incomplete. It turns live again on AllBlocksCleared or a publisher restart.

Layout (memory-conscious, in the style of scheduling.prefix.index):
- ``_map: dict[key -> int]``, a bit set over slots, three bits per slot s: bit 3s = on the GPU (events),
  3s+1 = on the CPU (events), 3s+2 = speculative (Pointsman routed a request there; not yet confirmed).
  One entry per distinct key, shared by every slot holding it; single-holder values are interned ints.
- per slot and medium: ``dict[engine hash -> entry]``; the entry is the key itself when one engine block is one
  key block (the common case), else a tuple (last full key, partial tail as packed tokens, own keys). A deque of
  engine hashes in store order bounds the slot (`capacity` per medium): past it, the least recently stored
  blocks are dropped (engines publish nothing on a cache hit, so store order is the only recency there is).
  Duplicate stores of one hash (vLLM can cache two physical blocks with equal content) are counted, so one
  BlockRemoved does not drop a block that is still cached.
- speculative entries: per endpoint ``dict[key -> expiry]`` and a FIFO expiry queue. An event storing the key
  confirms it (the speculative bit goes); otherwise it lapses after `speculative_ttl` seconds.

Matching walks the request's keys from the start, AND-ing holder sets: a slot's match is the longest run of
consecutive blocks it holds in any form. Each matched block counts once, from the best source: GPU (events) >
CPU (events) > speculative; the score weighs GPU and speculative blocks with `gpu_weight`, CPU blocks with
`cpu_weight`. An endpoint's result is its best rank.

The index is a face over three collaborators: the block → holders table with the slots and the speculative
entries (scheduling.prefix.precise_holders.Holders), each slot's engine blocks within their capacity, where events
land (scheduling.prefix.precise_events.EngineBlocks), and the scoring walk (scheduling.prefix.precise_match.Matcher);
the layout's building blocks are in scheduling.prefix.precise_layout.

Public API: `PreciseIndex` (store, remove, clear, mark_unknown, set_state, forget, set_capacity,
add_speculative, expire, match, keys_for, state, states, size, counters) and `EndpointMatch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduling.prefix.precise_events import EngineBlocks
from scheduling.prefix.precise_holders import Holders
from scheduling.prefix.precise_layout import (
    CPU,
    DEFAULT_CAPACITY,
    GPU,
    LIVE,
    MALFORMED,
    MEDIA,
    ORPHAN,
    PENDING,
    STATE_RANK,
    UNKNOWN,
    EndpointMatch,
)
from scheduling.prefix.precise_match import Matcher
from scheduling.prefix.token_keys import chain_keys

__all__ = ["CPU", "DEFAULT_CAPACITY", "GPU", "LIVE", "MALFORMED", "MEDIA", "ORPHAN", "PENDING", "UNKNOWN",
           "EndpointMatch", "PreciseIndex"]


class PreciseIndex:
    def __init__(
        self,
        block_size: int = 16,
        capacity: int = DEFAULT_CAPACITY,
        speculative_ttl: float = 2.0,
        gpu_weight: float = 1.0,
        cpu_weight: float = 0.8,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if speculative_ttl < 0:
            raise ValueError(f"speculative_ttl must be >= 0, got {speculative_ttl}")
        self.block_size = block_size
        self.speculative_ttl = speculative_ttl
        self.holders = Holders(speculative_ttl)
        self.blocks = EngineBlocks(self.holders, block_size, capacity)
        self.matcher = Matcher(self.holders, gpu_weight, cpu_weight)
        # endpoint -> (when, what, minor): the event stream's last gap, replay or restart, as its subscriber reports
        # it (the estimated-latency scorer's prefix trust reads it); minor: a gap the replay filled
        self.disrupted: dict[str, tuple[float, str, bool]] = {}

    @property
    def counters(self) -> dict[str, int]:
        """What happened to blocks (stored, removed, orphaned, evicted, duplicates, unknown_removals, malformed)
        and speculative entries (speculative, confirmed, lapsed)."""
        return {**self.blocks.counters, **self.holders.counters}

    # ---- slots ------------------------------------------------------------------------------------------
    def set_state(self, endpoint: str, rank: int, state: str) -> None:
        """Set a slot's state (creating the slot), without touching what it holds."""
        if state not in STATE_RANK:
            raise ValueError(f"unknown slot state {state!r}; expected pending, live or unknown")
        self.holders.slot(endpoint, rank).state = state

    def state(self, endpoint: str) -> str | None:
        """The endpoint's state: the worst of its ranks (unknown > pending > live); None if it has no slot."""
        slots = self.holders.of(endpoint)
        if not slots:
            return None
        if len(slots) == 1:
            return slots[0].state
        return max((s.state for s in slots), key=STATE_RANK.__getitem__)

    def states(self) -> dict[str, str]:
        return {ep: self.state(ep) or PENDING for ep in self.holders.endpoints()}

    def slot_states(self, endpoint: str) -> dict[int, str]:
        return {s.rank: s.state for s in self.holders.of(endpoint)}

    def endpoints(self) -> list[str]:
        return self.holders.endpoints()

    def size(self, endpoint: str, medium: int | None = None) -> int:
        """Engine blocks held by the endpoint (all ranks; one medium or both)."""
        media = (GPU, CPU) if medium is None else (medium,)
        return sum(len(s.maps[m]) for s in self.holders.of(endpoint) for m in media)

    def __len__(self) -> int:
        """Distinct keys in the index."""
        return len(self.holders.map)

    def set_capacity(self, endpoint: str, capacity: int) -> None:
        """Bound each of the endpoint's slots to `capacity` engine blocks per medium (drops the oldest now)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.blocks.set_capacity(endpoint, capacity)

    def keys_for(self, tokens: Sequence[int], lora: str | None = None, max_blocks: int | None = None) -> list[int]:
        """The request-side keys of a tokenized prompt at this index's block size."""
        return chain_keys(tokens, self.block_size, lora, max_blocks)

    # ---- engine events ----------------------------------------------------------------------------------
    def store(self, endpoint: str, rank: int, block_hashes: Sequence[int], parent: int | None,
              token_ids: Sequence[int], block_size: int, lora: str | None = None, medium: int = GPU) -> int:
        """Apply one BlockStored. Returns the engine blocks newly indexed, or ORPHAN (parent unknown: dropped)
        or MALFORMED. An event without tokens re-homes already known blocks on `medium` (offloading)."""
        return self.blocks.store(endpoint, rank, block_hashes, parent, token_ids, block_size, lora, medium)

    def remove(self, endpoint: str, rank: int, block_hashes: Iterable[int], medium: int = GPU) -> int:
        """Apply one BlockRemoved. Returns the engine blocks dropped."""
        return self.blocks.remove(endpoint, rank, block_hashes, medium)

    def clear(self, endpoint: str, rank: int, state: str = LIVE) -> None:
        """AllBlocksCleared, or a publisher that started afresh: the slot holds nothing and is `state`.
        The endpoint's speculative entries go too (they predate the reset)."""
        holders = self.holders
        slot = holders.slot(endpoint, rank)
        holders.empty(slot)
        holders.drop_speculative(endpoint)
        slot.state = state

    def mark_unknown(self, endpoint: str, rank: int) -> None:
        """Batches were lost: empty the slot and mark it unknown until a reset or a restart."""
        self.clear(endpoint, rank, UNKNOWN)

    def note_disruption(self, endpoint: str, now: float, what: str, minor: bool = False) -> None:
        """The event stream of `endpoint` had a gap (`minor` once a replay filled it) or its publisher restarted."""
        self.disrupted[endpoint] = (now, what, minor)

    def forget(self, endpoint: str) -> None:
        """The endpoint left: drop its slots, entries and speculative entries."""
        self.disrupted.pop(endpoint, None)
        self.blocks.forget(endpoint)
        self.holders.release(endpoint)

    # ---- speculative entries ----------------------------------------------------------------------------
    def add_speculative(self, endpoint: str, keys: Sequence[int], now: float, ttl: float | None = None) -> int:
        """Pointsman routed a request with these keys to `endpoint` at `now`: hold them speculatively until events
        confirm them or `ttl` (default `speculative_ttl`) seconds pass. Keys the endpoint already holds by events
        are skipped. Returns the number of speculative entries added or refreshed."""
        self.expire(now)
        ttl = self.speculative_ttl if ttl is None else ttl
        if ttl <= 0 or not keys:
            return 0
        return self.holders.add_speculative(endpoint, keys, now, ttl)

    def end_speculative(self, endpoint: str, keys: Sequence[int], now: float, ttl: float | None = None) -> int:
        """The request that made these speculative entries ended at `now`: those events have not confirmed yet
        expire `ttl` (default `speculative_ttl`) later at the latest. Returns how many were shortened."""
        return self.holders.shorten(endpoint, keys, now + (self.speculative_ttl if ttl is None else ttl))

    def expire(self, now: float) -> None:
        """Drop speculative entries whose time is up."""
        self.holders.expire(now)

    # ---- matching ---------------------------------------------------------------------------------------
    def match(self, keys: Sequence[int], now: float | None = None) -> dict[str, EndpointMatch]:
        """Endpoint → its best rank's longest consecutive matched prefix (endpoints matching nothing omitted)."""
        if now is not None:
            self.holders.expire(now)
        return self.matcher.match(keys)

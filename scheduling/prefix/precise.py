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

Applying BlockStored / BlockRemoved and the capacity bound are functions in scheduling.prefix.precise_events,
bound as the index's methods; the layout's building blocks are in scheduling.prefix.precise_layout.

Public API: `PreciseIndex` (store, remove, clear, mark_unknown, set_state, forget, set_capacity,
add_speculative, expire, match, keys_for, state, states, size, counters) and `EndpointMatch`.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.prefix import precise_events
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
    Slot,
    Speculative,
    unset,
    walk,
)
from scheduling.prefix.token_keys import ROOT, chain_keys, root_key

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
        self.capacity = capacity
        self.speculative_ttl = speculative_ttl
        self.gpu_weight = gpu_weight
        self.cpu_weight = cpu_weight
        self._map: dict[int, int] = {}
        self._slots: list[Slot | None] = []
        self._by: dict[tuple[str, int], Slot] = {}
        self._ep: dict[str, list[Slot]] = {}
        self._caps: dict[str, int] = {}
        self._free: list[int] = []
        self._low = 0  # bit 3s of every allocated slot
        self._roots: dict[str | None, int] = {None: ROOT}
        self._specs = Speculative(speculative_ttl)
        self._spec = self._specs.entries  # endpoint -> key -> expiry
        # endpoint -> (when, what, minor): the event stream's last gap, replay or restart, as its subscriber reports
        # it (the estimated-latency scorer's prefix trust reads it); minor: a gap the replay filled
        self.disrupted: dict[str, tuple[float, str, bool]] = {}
        self.counters = {"stored": 0, "removed": 0, "orphaned": 0, "evicted": 0, "duplicates": 0,
                         "unknown_removals": 0, "malformed": 0, "speculative": 0, "confirmed": 0, "lapsed": 0}

    # ---- slots ------------------------------------------------------------------------------------------
    def _slot(self, endpoint: str, rank: int) -> Slot:
        slot = self._by.get((endpoint, rank))
        if slot is not None:
            return slot
        index = self._free.pop() if self._free else len(self._slots)
        slot = Slot(endpoint, rank, index)
        if index == len(self._slots):
            self._slots.append(slot)
        else:
            self._slots[index] = slot
        self._by[(endpoint, rank)] = slot
        self._ep.setdefault(endpoint, []).append(slot)
        self._low |= slot.bits[GPU]
        spec = self._spec.get(endpoint)
        if spec:  # a new rank of an endpoint with speculative entries gets them too
            m = self._map
            for k in spec:
                m[k] = m.get(k, 0) | slot.sbit
        return slot

    def set_state(self, endpoint: str, rank: int, state: str) -> None:
        """Set a slot's state (creating the slot), without touching what it holds."""
        if state not in STATE_RANK:
            raise ValueError(f"unknown slot state {state!r}; expected pending, live or unknown")
        self._slot(endpoint, rank).state = state

    def state(self, endpoint: str) -> str | None:
        """The endpoint's state: the worst of its ranks (unknown > pending > live); None if it has no slot."""
        slots = self._ep.get(endpoint)
        if not slots:
            return None
        if len(slots) == 1:
            return slots[0].state
        return max((s.state for s in slots), key=STATE_RANK.__getitem__)

    def states(self) -> dict[str, str]:
        return {ep: self.state(ep) or PENDING for ep in self._ep}

    def slot_states(self, endpoint: str) -> dict[int, str]:
        return {s.rank: s.state for s in self._ep.get(endpoint, ())}

    def endpoints(self) -> list[str]:
        return list(self._ep)

    def size(self, endpoint: str, medium: int | None = None) -> int:
        """Engine blocks held by the endpoint (all ranks; one medium or both)."""
        media = (GPU, CPU) if medium is None else (medium,)
        return sum(len(s.maps[m]) for s in self._ep.get(endpoint, ()) for m in media)

    def __len__(self) -> int:
        """Distinct keys in the index."""
        return len(self._map)

    def set_capacity(self, endpoint: str, capacity: int) -> None:
        """Bound each of the endpoint's slots to `capacity` engine blocks per medium (drops the oldest now)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._caps[endpoint] = capacity
        for slot in self._ep.get(endpoint, ()):
            for medium in (GPU, CPU):
                self._trim(slot, medium, capacity)

    def keys_for(self, tokens: Sequence[int], lora: str | None = None, max_blocks: int | None = None) -> list[int]:
        """The request-side keys of a tokenized prompt at this index's block size."""
        return chain_keys(tokens, self.block_size, lora, max_blocks)

    def _root(self, lora: str | None) -> int:
        r = self._roots.get(lora)
        if r is None:
            if len(self._roots) > 4096:
                self._roots.clear()
                self._roots[None] = ROOT
            r = self._roots[lora] = root_key(lora)
        return r

    # ---- engine events (scheduling/prefix/precise_events.py; functions bound as methods) ----------------------
    store = precise_events.store
    _store_aligned = precise_events.store_aligned
    _store_general = precise_events.store_general
    _store_known = precise_events.store_known
    remove = precise_events.remove
    _trim = precise_events.trim

    def _empty(self, slot: Slot) -> None:
        for medium in (GPU, CPU):
            bit = slot.bits[medium]
            for e in slot.maps[medium].values():
                unset(self._map, e, bit)
            slot.maps[medium].clear()
            slot.orders[medium].clear()
            slot.dups[medium].clear()

    def clear(self, endpoint: str, rank: int, state: str = LIVE) -> None:
        """AllBlocksCleared, or a publisher that started afresh: the slot holds nothing and is `state`.
        The endpoint's speculative entries go too (they predate the reset)."""
        slot = self._slot(endpoint, rank)
        self._empty(slot)
        self._drop_spec(endpoint)
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
        self._drop_spec(endpoint)
        self._spec.pop(endpoint, None)
        self._caps.pop(endpoint, None)
        for slot in self._ep.pop(endpoint, ()):
            self._empty(slot)
            del self._by[(endpoint, slot.rank)]
            self._slots[slot.index] = None
            self._low &= ~slot.bits[GPU]
            self._free.append(slot.index)

    # ---- speculative entries ----------------------------------------------------------------------------
    def _sbits(self, endpoint: str) -> int:
        bits = 0
        for s in self._ep.get(endpoint, ()):
            bits |= s.sbit
        return bits

    def _confirm(self, endpoint: str, key: int) -> None:
        self._specs.confirm(self._map, endpoint, key, self._sbits(endpoint))
        self.counters["confirmed"] += 1

    def _drop_spec(self, endpoint: str) -> None:
        if self._spec.get(endpoint):
            self._specs.drop(self._map, endpoint, self._sbits(endpoint))

    def add_speculative(self, endpoint: str, keys: Sequence[int], now: float, ttl: float | None = None) -> int:
        """Pointsman routed a request with these keys to `endpoint` at `now`: hold them speculatively until events
        confirm them or `ttl` (default `speculative_ttl`) seconds pass. Keys the endpoint already holds by events
        are skipped. Returns the number of speculative entries added or refreshed."""
        self.expire(now)
        ttl = self.speculative_ttl if ttl is None else ttl
        if ttl <= 0 or not keys:
            return 0
        if endpoint not in self._ep:
            self._slot(endpoint, 0)
        sbits = held = 0
        for s in self._ep[endpoint]:
            sbits |= s.sbit
            held |= s.held
        added = self._specs.add(self._map, endpoint, keys, now, sbits, held, ttl)
        self.counters["speculative"] += added
        return added

    def end_speculative(self, endpoint: str, keys: Sequence[int], now: float, ttl: float | None = None) -> int:
        """The request that made these speculative entries ended at `now`: those events have not confirmed yet
        expire `ttl` (default `speculative_ttl`) later at the latest. Returns how many were shortened."""
        return self._specs.shorten(endpoint, keys, now + (self.speculative_ttl if ttl is None else ttl))

    def expire(self, now: float) -> None:
        """Drop speculative entries whose time is up."""
        self.counters["lapsed"] += self._specs.expire(self._map, now, self._sbits)

    # ---- matching ---------------------------------------------------------------------------------------
    def match(self, keys: Sequence[int], now: float | None = None) -> dict[str, EndpointMatch]:
        """Endpoint → its best rank's longest consecutive matched prefix (endpoints matching nothing omitted)."""
        if now is not None:
            self.expire(now)
        low = self._low
        if not keys or not low:
            return {}
        ends, extra = walk(self._map, low, keys)
        return self._results(ends, extra)

    def _results(self, ends: dict[int, int], extra: dict[int, list[int]]) -> dict[str, EndpointMatch]:
        out: dict[str, EndpointMatch] = {}
        gw, cw = self.gpu_weight, self.cpu_weight
        slots = self._slots
        for s, blocks in ends.items():
            if not blocks:
                continue
            slot = slots[s]
            if slot is None:
                continue
            cpu, spec = extra.get(s, (0, 0))
            gpu = blocks - cpu - spec
            res = EndpointMatch(blocks, (gpu + spec) * gw + cpu * cw, gpu, cpu, spec, slot.rank, slot.state)
            best = out.get(slot.endpoint)
            if best is None or (res.score, res.blocks, -res.rank) > (best.score, best.blocks, -best.rank):
                out[slot.endpoint] = res
        return out

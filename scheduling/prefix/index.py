"""A bounded index of which endpoint holds which prompt block.

Layout (designed for 512 endpoints × 31,250 blocks in pure Python):
- `_map: dict[block hash -> int]`, a bit set over endpoint slots: bit 2s = slot s holds the block, bit 2s+1 =
  slot s touched it again since the clock hand last passed (the "referenced" bit).
- per endpoint slot: a ring `array('Q')` of the block hashes it holds (8 bytes per block) and a clock hand.

Eviction is CLOCK (second chance), the standard constant-memory approximation of LRU: when an endpoint is at
capacity, the hand sweeps its ring, clearing referenced bits, and replaces the first unreferenced block.
Memory per endpoint is therefore bounded by its capacity: 8 bytes of ring per held block plus one dict entry
per distinct block (shared by every endpoint holding it). Single-holder bit sets are interned ints.

Matching walks the request's blocks from the start, AND-ing the holder sets: an endpoint's match length is the
position where its bit drops out.

`room()` maps each endpoint to the blocks it can still take before evicting (capacity − held), kept current by
every change, so a scorer pricing eviction over the whole pool reads one dict instead of calling per endpoint;
`low_room()` holds the few entries below `LOW_ROOM`, so a prompt of fewer blocks finds the endpoints short of room
for it without reading every endpoint's.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from scheduling.prefix.hashing import BlockHasher

DEFAULT_CAPACITY = 31_250
LOW_ROOM = 4096  # `low_room()` holds every endpoint with less room than this (blocks)


class PrefixIndex:
    def __init__(self, default_capacity: int = DEFAULT_CAPACITY) -> None:
        if default_capacity <= 0:
            raise ValueError("default_capacity must be positive")
        self.default_capacity = default_capacity
        self._map: dict[int, int] = {}
        self._slot_of: dict[str, int] = {}
        self._keys: list[str | None] = []
        self._rings: list[array[Any]] = []
        self._hands: list[int] = []
        self._caps: list[int] = []
        self._last: list[float] = []
        self._hold: list[int] = []  # interned 1 << 2s
        self._free: list[int] = []
        self._even = 0  # all "holds" bits of allocated slots
        self._room: dict[str, int] = {}  # endpoint key -> capacity - blocks held
        self._low: dict[str, int] = {}  # the entries of _room below LOW_ROOM

    # ---- endpoints -------------------------------------------------------------------------------------
    def _slot(self, key: str) -> int:
        slot = self._slot_of.get(key)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self._keys[slot] = key
            self._rings[slot] = array("Q")
            self._hands[slot] = 0
            self._caps[slot] = self.default_capacity
            self._last[slot] = 0.0
        else:
            slot = len(self._keys)
            self._keys.append(key)
            self._rings.append(array("Q"))
            self._hands.append(0)
            self._caps.append(self.default_capacity)
            self._last.append(0.0)
            self._hold.append(1 << (2 * slot))
            self._even |= self._hold[slot]
        self._slot_of[key] = slot
        self._set_room(key, self.default_capacity)
        return slot

    def endpoints(self) -> list[str]:
        return list(self._slot_of)

    def capacity(self, key: str) -> int:
        slot = self._slot_of.get(key)
        return self.default_capacity if slot is None else self._caps[slot]

    def room(self) -> Mapping[str, int]:
        """Endpoint key -> blocks it can take before evicting (capacity − held); endpoints the index does not
        know can take `default_capacity`. Read-only."""
        return self._room

    def low_room(self) -> Mapping[str, int]:
        """The entries of `room()` below `LOW_ROOM` blocks, all of them (so a reader that needs fewer blocks than
        that finds every endpoint short of them here, without reading the whole pool's room). Read-only."""
        return self._low

    def _set_room(self, key: str, room: int) -> None:
        self._room[key] = room
        if room < LOW_ROOM:
            self._low[key] = room
        elif key in self._low:
            del self._low[key]

    def size(self, key: str) -> int:
        """Blocks currently held by `key`."""
        slot = self._slot_of.get(key)
        return 0 if slot is None else len(self._rings[slot])

    def __len__(self) -> int:
        """Distinct blocks in the index."""
        return len(self._map)

    def set_capacity(self, key: str, capacity: int) -> None:
        """Change one endpoint's capacity; shrinking evicts the blocks next in clock order."""
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        slot = self._slot(key)
        self._caps[slot] = capacity
        ring = self._rings[slot]
        excess = len(ring) - capacity
        self._set_room(key, max(0, -excess))
        if excess <= 0:
            return
        hand = self._hands[slot]
        order = ring[hand:] + ring[:hand]
        self._drop(slot, order[:excess])
        self._rings[slot] = order[excess:]
        self._hands[slot] = 0

    def _drop(self, slot: int, hashes: Iterable[int]) -> None:
        m = self._map
        both = self._hold[slot] * 3
        for h in hashes:
            v = m[h] & ~both
            if v:
                m[h] = v
            else:
                del m[h]

    def forget(self, key: str) -> None:
        """Drop everything known about an endpoint (it left the pool)."""
        slot = self._slot_of.pop(key, None)
        if slot is None:
            return
        del self._room[key]
        self._low.pop(key, None)
        self._drop(slot, self._rings[slot])
        self._rings[slot] = array("Q")
        self._keys[slot] = None
        self._free.append(slot)

    def seen(self, keys: Iterable[str], now: float) -> None:
        """Mark endpoints as still present (they were candidates at `now`)."""
        slot_of = self._slot_of
        last = self._last
        for key in keys:
            slot = slot_of.get(key)
            if slot is not None and last[slot] < now:
                last[slot] = now

    def forget_idle(self, now: float, idle_seconds: float) -> list[str]:
        """Forget endpoints not recorded into for `idle_seconds`; returns their keys."""
        gone = [k for k, s in self._slot_of.items() if now - self._last[s] > idle_seconds]
        for key in gone:
            self.forget(key)
        return gone

    # ---- queries ---------------------------------------------------------------------------------------
    def match_lazy(self, blocks: BlockHasher, chunk: int = 16) -> dict[str, int]:
        """Endpoint key -> number of consecutive blocks from the start it holds (endpoints with 0 omitted).

        The prompt is hashed only a little past the point where the last endpoint stops matching (by steps of
        max(chunk, half of what is already matched))."""
        total = blocks.total
        if not total:
            return {}
        hashes = blocks.upto(chunk)
        get = self._map.get
        alive = get(hashes[0], 0) & self._even
        if not alive:
            return {}
        out: dict[str, int] = {}
        i = 1
        while True:
            limit = len(hashes)
            while i < limit:
                nxt = alive & get(hashes[i], 0)
                if nxt != alive:
                    self._emit(alive ^ nxt, i, out)
                    if not nxt:
                        return out
                    alive = nxt
                i += 1
            if i >= total:
                break
            hashes = blocks.upto(i + max(chunk, i >> 1))  # grow by half: long matches, few calls
        self._emit(alive, total, out)
        return out

    def _emit(self, bits: int, n: int, out: dict[str, int]) -> None:
        keys = self._keys
        while bits:
            low = bits & -bits
            key = keys[(low.bit_length() - 1) >> 1]
            if key is not None:
                out[key] = n
            bits ^= low

    def holds(self, key: str, h: int) -> bool:
        slot = self._slot_of.get(key)
        return slot is not None and bool(self._map.get(h, 0) & self._hold[slot])

    # ---- updates ---------------------------------------------------------------------------------------
    def record(self, key: str, hashes: Iterable[int], now: float = 0.0) -> None:
        """The endpoint now holds these blocks (inserted, or marked recently used).

        At capacity, CLOCK picks the victim: the hand sweeps the ring, clearing referenced bits, and the first
        unreferenced block is replaced. (Inlined: this runs for every block of every committed request.)
        """
        slot = self._slot(key)
        self._last[slot] = now
        hold = self._hold[slot]
        ref = hold << 1
        m = self._map
        get = m.get
        ring = self._rings[slot]
        cap = self._caps[slot]
        size = len(ring)
        hand = self._hands[slot]
        for h in hashes:
            v = get(h)
            if v is not None and v & hold:
                if not v & ref:
                    m[h] = v | ref
                continue
            if size < cap:
                ring.append(h)
                size += 1
            else:
                while True:
                    old = ring[hand]
                    ov = m[old]
                    if ov & ref:
                        m[old] = ov ^ ref
                    else:
                        ov ^= hold
                        if ov:
                            m[old] = ov
                        else:
                            del m[old]
                        ring[hand] = h
                        hand += 1
                        if hand >= size:
                            hand = 0
                        break
                    hand += 1
                    if hand >= size:
                        hand = 0
            # eviction only touches blocks this endpoint held, never `h`, so `v` is still current
            m[h] = hold if v is None else v | hold
        self._hands[slot] = hand
        self._set_room(key, cap - size)
